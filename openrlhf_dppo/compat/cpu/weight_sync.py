"""The trainer -> vLLM weight sync on CPU (why: ``patches.PATCHES``): the trainer's side of a gloo group
(``patch_gloo_weight_sync``), the engine's (``patch_worker_extension``: ``compat.vllm_worker``), and the
opt-in check by per-tensor digests after every sync (``patch_verify_sync``).
"""

from __future__ import annotations

import functools
import json
import os
import time

from openrlhf_dppo.compat.cpu.hooks import ENV_SYNC_TIMEOUT, ENV_VERIFY, after_import, once
from openrlhf_dppo.compat.cpu.watchdog import heartbeat

EXTENSION_CLS = "openrlhf_dppo.compat.vllm_worker.CPUWorkerExtension"
WORKER_CLS = "openrlhf_dppo.compat.vllm_worker.CPUEngineWorker"
DIGEST_REQUEST = "__openrlhf_dppo_weight_digests__"  # sentinel weight name: "return your digests"


class GlooBroadcastGroup:
    """A stateless gloo group (trainer rank 0 + every vLLM worker) with the broadcast OpenRLHF calls, in
    place of vLLM's ``PyNcclCommunicator``; ``torch.distributed``'s default group is never touched."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float | None = None):
        from datetime import timedelta

        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s or float(os.environ.get(ENV_SYNC_TIMEOUT, "600")))
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.pg = dist.ProcessGroupGloo(
            dist.PrefixStore("openrlhf_dppo_weight_sync", store), rank, world_size, timeout
        )
        self._store = store  # keep the server alive on rank 0
        # with the sync verified: the digest of every tensor this rank sent, in order (verify_weights
        # takes them, to tell on a mismatch which side differs from what went over the wire)
        self.sent: list[str] | None = [] if os.environ.get(ENV_VERIFY) else None

    def broadcast(self, tensor, src: int = 0, stream=None):
        """Broadcast ``tensor`` (any shape, in place) from rank ``src``; ``stream`` is ignored on CPU."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        try:
            self.pg.broadcast([tensor], opts).wait()
        except RuntimeError as e:
            raise RuntimeError(
                f"trainer -> vLLM weight broadcast failed or timed out after {self.timeout} "
                f"(rank {self.rank} of {self.world_size}): {e}"
            ) from e
        if self.sent is not None and self.rank == src:
            self.sent.append(tensor_digest(tensor))
        return tensor


def patch_gloo_weight_sync() -> None:
    """Trainer side: ``stateless_init_process_group`` (in ``distributed_util`` and where ``ppo_actor``
    bound it) -> ``GlooBroadcastGroup``."""

    def make(master_address, master_port, rank, world_size, device):
        return GlooBroadcastGroup(master_address, master_port, rank, world_size)

    make._openrlhf_dppo_cpu = True
    after_import(
        "openrlhf.utils.distributed_util", lambda m: setattr(m, "stateless_init_process_group", make)
    )
    after_import("openrlhf.trainer.ray.ppo_actor", lambda m: setattr(m, "stateless_init_process_group", make))


class _EngineActorProxy:
    """Stands in for ``vllm_engine.RolloutRayActor`` in ``create_vllm_engines``: same ``options()``/
    ``remote()``, with keyword arguments of the engine replaced by ``overrides`` (our
    ``worker_extension_cls`` and ``worker_cls``, the engine dtype)."""

    def __init__(self, actor_cls):
        self._actor_cls = actor_cls
        self.overrides: dict = {}

    def options(self, **options):
        proxy = _EngineActorProxy(self._actor_cls.options(**options))
        proxy.overrides = self.overrides
        return proxy

    def remote(self, *args, **kwargs):
        return self._actor_cls.remote(*args, **{**kwargs, **self.overrides})

    def __getattr__(self, name):
        return getattr(self._actor_cls, name)


def override_engine_kwargs(**overrides) -> None:
    """Replace these keyword arguments of every vLLM engine ``create_vllm_engines`` makes (driver)."""

    def patch(module):
        if not isinstance(module.RolloutRayActor, _EngineActorProxy):
            module.RolloutRayActor = _EngineActorProxy(module.RolloutRayActor)
        module.RolloutRayActor.overrides.update(overrides)

    after_import("openrlhf.trainer.ray.vllm_engine", patch)


def patch_worker_extension() -> None:
    """``create_vllm_engines`` hard-codes ``openrlhf...WorkerWrap``; give vLLM ours instead (driver),
    and our worker class, which installs the ``vllm_engine`` patches when vLLM builds it."""
    override_engine_kwargs(worker_extension_cls=EXTENSION_CLS, worker_cls=WORKER_CLS)


def tensor_digest(t) -> str:
    """Exact fingerprint of a tensor's dtype, shape and bytes (20 hex characters of a sha256)."""
    import hashlib

    import torch

    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype.is_floating_point or flat.dtype == torch.bool else flat
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(raw.numpy().tobytes())
    return h.hexdigest()[:20]


def patch_verify_sync() -> None:
    """Opt-in (``OPENRLHF_DPPO_VERIFY_SYNC=<file.jsonl>``): ``verify_weights`` after every
    ``ActorPPOTrainer.broadcast_to_vllm``."""
    path = os.environ.get(ENV_VERIFY)
    if not path:
        return

    def patch(module):
        import ray
        import torch

        def factory(original):
            @functools.wraps(original)
            def broadcast_to_vllm(self):
                original(self)
                heartbeat("weight sync done")
                verify_weights(self, path, ray, torch)

            return broadcast_to_vllm

        once(module.ActorPPOTrainer, "broadcast_to_vllm", factory)

    after_import("openrlhf.trainer.ray.ppo_actor", patch)


def verify_weights(trainer, path: str, ray, torch) -> dict | None:
    """Compare the trainer's (gathered) parameters with every engine's per-tensor digests (asked with
    ``DIGEST_REQUEST``); append the record to ``path`` and return it (None on ranks other than 0, which
    only join the gather). RuntimeError on a mismatched or missing tensor."""
    import deepspeed

    model = trainer.actor.model.module
    params = list(model.named_parameters())
    zero3 = trainer.strategy.args.ds.zero_stage == 3
    with deepspeed.zero.GatheredParameters([p for _, p in params], enabled=zero3):
        if torch.distributed.get_rank() != 0:
            return None
        ours = {name: tensor_digest(p.data) for name, p in params}
    # what this sync's broadcast sent, in OpenRLHF's order (every parameter, named_parameters order)
    sent_list = getattr(getattr(trainer, "_model_update_group", None), "sent", None) or []
    sent = dict(zip(ours, sent_list)) if len(sent_list) == len(ours) else {}
    sent_list.clear()  # the next sync starts afresh
    trainer._openrlhf_dppo_syncs = getattr(trainer, "_openrlhf_dppo_syncs", 0) + 1
    record: dict = {
        "sync": trainer._openrlhf_dppo_syncs,
        "time": time.time(),
        "n_tensors": len(ours),
        "engines": [],
    }
    for i, engine in enumerate(trainer.vllm_engines):
        # the dtype of a digest request is never read; the parameters' own keeps the call well-formed
        request = engine.update_weight.remote(DIGEST_REQUEST, dtype=params[0][1].dtype, shape=(0,))
        per_worker = ray.get(request)
        for w, theirs in enumerate(per_worker):
            mismatched = sorted(n for n in ours if n in theirs and theirs[n] != ours[n])
            missing = sorted(n for n in ours if n not in theirs)
            entry = {"engine": i, "worker": w, "mismatched": mismatched, "missing": missing}
            if mismatched and sent:
                # as_sent: the engine holds what was sent, the trainer's parameter reads otherwise now (a
                # stale tensor sent, or a wrong reading of its own); not_as_sent: the engine stored
                # something other than what it was sent
                entry["as_sent"] = [n for n in mismatched if sent.get(n) == theirs[n]]
                entry["not_as_sent"] = [n for n in mismatched if sent.get(n) != theirs[n]]
            record["engines"].append(entry)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    bad = [e for e in record["engines"] if e["mismatched"] or e["missing"]]
    if bad:
        raise RuntimeError(
            f"vLLM weights differ from the trainer's after weight sync {record['sync']}: {bad}"
        )
    return record
