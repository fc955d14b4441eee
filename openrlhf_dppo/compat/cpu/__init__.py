"""Run OpenRLHF 0.11.2's real Ray pipeline on a machine without a GPU (docs/DESIGN.md, "CPU path").

``apply()`` makes the unmodified pipeline run on CPU. It does nothing unless the run is a CPU run
(``device_choice.decide``), and starts nothing itself: host modules are patched right after their import,
and ``ray.init`` is wrapped so that Ray's workers run ``worker_setup()`` when they start. The patches are
``patches.PATCHES``; the vLLM engine side is ``openrlhf_dppo.compat.vllm_worker``. Environment:
``OPENRLHF_DPPO_DEVICE``, ``OPENRLHF_DPPO_CPU_PRECISION``, ``OPENRLHF_DPPO_CPU_DISABLE``,
``OPENRLHF_DPPO_VERIFY_SYNC``, ``OPENRLHF_DPPO_WATCHDOG_S``, ``OPENRLHF_DPPO_SYNC_TIMEOUT_S``.
"""

from __future__ import annotations

import os

from openrlhf_dppo import precision as cpu_precision
from openrlhf_dppo.compat.cpu import device_choice
from openrlhf_dppo.compat.cpu.device_choice import (  # noqa: F401
    CPU,
    DeviceChoice,
    DeviceChoiceError,
    decide,
    decide_locally,
)
from openrlhf_dppo.compat.cpu.hooks import ENV_ACTIVE, ENV_DISABLE, log
from openrlhf_dppo.compat.cpu.patches import DRIVER, PATCHES, RAY_WORKER, check_names, enabled, install
from openrlhf_dppo.compat.cpu.ray_init import stand_in_gpus, worker_pythonpath, wrap_ray_init  # noqa: F401


def worker_setup() -> None:
    """Ray's ``worker_process_setup_hook``: the worker's own CUDA check (``DeviceMismatch``), then its patches."""
    from openrlhf_dppo._host import prepare_host

    device_choice.check_worker()
    cpu_precision.separate_inductor_cache()  # the driver's folder, or this node's own environment's
    prepare_host()  # the flash-attn stand-in, when flash-attn is missing
    install(RAY_WORKER)


def apply(
    fake_gpus: int = 4,
    num_cpus: int | None = None,
    stall_s: float | None = None,
    startup_s: float | None = None,
    precision: str | None = None,
    choice: DeviceChoice | None = None,
    **switches: bool,
) -> bool:
    """Make OpenRLHF's Ray pipeline run on CPU; returns False (a no-op) unless this is a CPU run.

    ``fake_gpus``: GPU resources Ray advertises (``stand_in_gpus(args)`` is what a run needs).
    ``stall_s`` / ``startup_s``: watchdog limits (env ``OPENRLHF_DPPO_WATCHDOG_S``, default 600 / 900).
    ``precision``: the run's ``--ds.param_dtype``, put in ``OPENRLHF_DPPO_CPU_PRECISION`` for the engine
    (None: OpenRLHF's bfloat16 engine). ``choice``: where the workers compute (``decide()``; None: decided
    here). ``switches``: ``name=False`` / ``name=True`` turns a patch of ``PATCHES`` off / on.
    """
    check_names(switches)
    choice = decide() if choice is None else choice
    if choice.device != CPU:
        log(f"CPU layer off: the workers compute on {choice.device} ({choice.why})")
        return False
    from openrlhf_dppo._host import prepare_host

    prepare_host()  # flash-attn stand-in + version guard

    # the workers read the switches from the environment
    off = sorted(n for n in PATCHES if not enabled(n, switches))
    if off:
        os.environ[ENV_DISABLE] = ",".join(off)
    else:
        os.environ.pop(ENV_DISABLE, None)
    os.environ[ENV_ACTIVE] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["PYTHONPATH"] = worker_pythonpath()
    cpu_precision.separate_inductor_cache()  # vllm-cpu's sampler is torch.compile'd: a cache of this environment
    if precision is not None:
        # logged before the variable is set: the line says where the choice came from
        log(cpu_precision.describe(precision))
        os.environ[cpu_precision.ENV] = precision

    log(f"a CPU run: {choice.why}")
    install(DRIVER)
    if enabled("ray_fake_gpus") or enabled("watchdog"):
        wrap_ray_init(fake_gpus, num_cpus, stall_s, startup_s, switches)
    log(f"CPU patches on: {', '.join(n for n in PATCHES if n not in off)}" + (f"; off: {off}" if off else ""))
    return True
