"""The ``ray.init`` wrapper: when OpenRLHF's ``train`` starts Ray, the driver's watchdog starts (patch
``watchdog``) and Ray gets stand-in GPUs and a runtime_env that runs ``worker_setup`` in every worker
(patch ``ray_fake_gpus``).
"""

from __future__ import annotations

import functools
import os

from openrlhf_dppo import precision
from openrlhf_dppo.compat.cpu.hooks import (
    ENV_ACTIVE,
    ENV_DEVICE,
    ENV_DISABLE,
    ENV_HEARTBEAT,
    ENV_SYNC_TIMEOUT,
    ENV_VERIFY,
    once,
)
from openrlhf_dppo.compat.cpu.patches import enabled
from openrlhf_dppo.compat.cpu.watchdog import start_watchdog

SETUP_HOOK = "openrlhf_dppo.compat.cpu.worker_setup"

# the environment every Ray worker needs from the driver (Ray does not pass the driver's env on)
WORKER_ENV = (
    ENV_DISABLE,
    ENV_ACTIVE,
    ENV_DEVICE,  # named by a worker that refuses the CPU layer (device_choice.check_worker)
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
    precision.ENV,  # the run's resolved precision (engine dtype)
    *precision.ISA_CAPS,  # an emulated CPU (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) must be one everywhere
    *precision.INDUCTOR_ENV,  # torch.compile's cache: this environment's (and cap's), not the user-wide one
)


def wrap_ray_init(
    fake_gpus: int,
    num_cpus: int | None,
    stall_s: float | None,
    startup_s: float | None,
    switches: dict,
) -> None:
    """Wrap ``ray.init`` (called by OpenRLHF's ``train``) once; see the module docstring."""
    import ray

    def factory(original):
        @functools.wraps(original)
        def init(*args, **kwargs):
            if enabled("watchdog", switches):
                start_watchdog(stall_s, startup_s)
            if enabled("ray_fake_gpus", switches):
                kwargs = ray_init_kwargs(kwargs, fake_gpus, num_cpus)
            return original(*args, **kwargs)

        return init

    once(ray, "init", factory)


def stand_in_gpus(args) -> int:
    """The stand-in GPUs a run needs: every GPU OpenRLHF 0.11.2's ``train(args)`` can ask for, each
    model group and vLLM engine counted on GPUs of its own (an upper bound: colocation only shares them).

    args: the hierarchical namespace OpenRLHF's validation made (critic and reward paths resolved).
    """

    def gpus(group) -> int:
        return group.num_nodes * group.num_gpus_per_node

    total = gpus(args.actor)
    if args.algo.kl.init_coef > 0:  # a reference model
        total += gpus(args.ref)
    if args.vllm.num_engines:
        total += args.vllm.num_engines * args.vllm.tensor_parallel_size
    if args.critic.model_name_or_path:
        total += gpus(args.critic)
    if not args.reward.remote_url:  # reward models (a reward function or agent needs no GPU)
        total += gpus(args.reward)
    return max(1, total)


def ray_init_kwargs(kwargs: dict, fake_gpus: int, num_cpus: int | None) -> dict:
    """``ray.init`` arguments with ``fake_gpus`` GPU resources and a runtime_env (merged with the caller's)
    that carries the setup hook and ``WORKER_ENV`` to every worker. Joining a cluster (``RAY_ADDRESS`` or
    an ``address`` argument), only the runtime_env is added: Ray refuses the resource arguments there."""
    out = dict(kwargs)
    runtime_env = dict(out.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars.update({k: os.environ[k] for k in WORKER_ENV if k in os.environ})
    runtime_env["env_vars"] = env_vars
    runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    out["runtime_env"] = runtime_env
    if os.environ.get("RAY_ADDRESS") or kwargs.get("address"):
        return out
    out.setdefault("num_gpus", fake_gpus)
    # each of OpenRLHF's {"GPU": 1, "CPU": 1} bundles also holds a (logical) CPU
    out.setdefault("num_cpus", num_cpus or max(8, fake_gpus + 4, os.cpu_count() or 1))
    out.setdefault("include_dashboard", False)
    return out


def worker_pythonpath() -> str:
    """``PYTHONPATH`` for Ray workers and vLLM's processes: the directory holding ``openrlhf_dppo``
    (so the setup hook and the worker extension import) and the flash-attn stand-in, then the rest."""
    import openrlhf_dppo
    from openrlhf_dppo.compat.flash_attn_stub import STUB_PATH

    root = os.path.dirname(os.path.dirname(os.path.abspath(openrlhf_dppo.__file__)))
    parts = [root, STUB_PATH]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)
