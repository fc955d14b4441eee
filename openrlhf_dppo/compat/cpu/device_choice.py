"""Where the run's workers compute, ``cpu`` or ``cuda``: decided once by the driver, checked by every worker.

The CPU layer is for a run that has no GPU anywhere. The driver's own torch cannot tell: on a GPU-less
head node (``ray job submit`` to a KubeRay head) or under ``CUDA_VISIBLE_DEVICES=""`` it sees no CUDA
while the Ray workers have GPUs, and the layer's stand-in GPUs, CPU device mesh, sdpa and gloo weight
sync must never reach those workers. So:

  1. ``OPENRLHF_DPPO_DEVICE`` = ``auto`` (default) | ``cpu`` | ``cuda``; ``cpu`` or ``cuda`` decides
     without asking anything (``cpu`` is refused on a driver that sees CUDA);
  2. ``auto``: a driver that sees CUDA runs a ``cuda`` run. One that does not and starts its own Ray
     (no ``RAY_ADDRESS``) runs on this machine: ``cpu``. One that joins a cluster (``RAY_ADDRESS``) asks
     it (``ray.nodes()``): ``cuda`` when a live node has GPUs that Ray detected there (a ``GPU`` resource
     with the accelerator type Ray records for hardware it found), else ``cpu``. A GPU count given by
     hand to ``ray start --num-gpus`` on a CPU node (the Slurm launcher's CPU runs) has no accelerator
     type: those are stand-ins, and the run is a CPU run;
  3. every Ray worker of a ``cpu`` run checks for itself before any patch (``check_worker``, run by the
     setup hook): a worker that sees CUDA refuses to start, and says what to set. Nothing is patched
     on a GPU in silence, whatever the driver decided (a GPU node the cluster did not have yet when it
     was asked, an autoscaler's, is caught here).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Callable, Mapping

from openrlhf_dppo.compat.cpu.hooks import ENV_DEVICE

AUTO, CPU, CUDA = "auto", "cpu", "cuda"
CHOICES = (AUTO, CPU, CUDA)
RAY_ADDRESS = "RAY_ADDRESS"
DETECTED_TYPE_RESOURCE = "accelerator_type:"  # Ray adds "accelerator_type:<type>" for the GPUs it detects
DETECTED_TYPE_LABEL = "ray.io/accelerator-type"  # and, in newer Ray, this node label


class DeviceChoiceError(ValueError):
    """``OPENRLHF_DPPO_DEVICE`` is bad, contradicts the driver, or the cluster could not be asked."""


class DeviceMismatch(RuntimeError):
    """A Ray worker that sees CUDA was handed the CPU layer."""


@dataclass(frozen=True)
class DeviceChoice:
    device: str  # CPU | CUDA: where the trainer's workers (actor, reference, vLLM engines) compute
    why: str  # one line for the log: what decided it


def requested(environ: Mapping[str, str] | None = None) -> str:
    """``OPENRLHF_DPPO_DEVICE`` (any case; empty = auto) -> AUTO | CPU | CUDA."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_DEVICE, "")
    choice = value.strip().lower() or AUTO
    if choice not in CHOICES:
        raise DeviceChoiceError(f"{ENV_DEVICE}={value!r}: expected one of {', '.join(CHOICES)}")
    return choice


def cluster_address(environ: Mapping[str, str] | None = None) -> str | None:
    """The address of the Ray cluster this run joins (``RAY_ADDRESS``); None: it starts its own."""
    env = os.environ if environ is None else environ
    address = env.get(RAY_ADDRESS, "").strip()
    return address if address and address != "local" else None


def detected_gpus(nodes: list[dict]) -> float:
    """GPUs of the live nodes in ``ray.nodes()`` that Ray found on the hardware (stand-ins not counted).

    nodes: ``ray.nodes()``'s records (``Alive``, ``Resources``, ``Labels``)."""
    total = 0.0
    for node in nodes:
        resources = node.get("Resources") or {}
        detected = any(k.startswith(DETECTED_TYPE_RESOURCE) for k in resources) or bool(
            (node.get("Labels") or {}).get(DETECTED_TYPE_LABEL)
        )
        if node.get("Alive", True) and detected:
            total += float(resources.get("GPU", 0))
    return total


def cluster_nodes(address: str) -> list[dict]:
    """``ray.nodes()`` of the cluster at ``address``; a connection made for the question is closed again
    (OpenRLHF's ``train`` then connects with its own runtime_env)."""
    import ray

    if ray.is_initialized():
        return ray.nodes()
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except Exception as err:  # any failure to connect: the message says how to decide without asking
        raise DeviceChoiceError(
            f"{RAY_ADDRESS}={address!r}: could not ask the Ray cluster whether it has GPUs ({err}); "
            f"set {ENV_DEVICE}=cuda or {ENV_DEVICE}=cpu to decide without asking"
        ) from err
    try:
        return ray.nodes()
    finally:
        ray.shutdown()


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def decide(
    environ: Mapping[str, str] | None = None,
    cuda_available: Callable[[], bool] | None = None,
    ask_cluster: Callable[[str], list[dict]] | None = None,
) -> DeviceChoice:
    """Where this run's workers compute (the module docstring's rules 1-2).

    environ: the driver's environment (None: ``os.environ``); cuda_available: whether the driver's torch
    sees CUDA (None: asks torch); ask_cluster: address -> ``ray.nodes()`` (None: ``cluster_nodes``).
    """
    env = os.environ if environ is None else environ
    driver_cuda = (cuda_available or _torch_sees_cuda)()
    choice = requested(env)
    if choice == CUDA:
        return DeviceChoice(CUDA, f"{ENV_DEVICE}=cuda")
    if choice == CPU:
        if driver_cuda:
            raise DeviceChoiceError(
                f"{ENV_DEVICE}=cpu, but this driver's torch sees CUDA: the CPU layer is for a run without "
                f"GPUs anywhere; unset {ENV_DEVICE} (or set it to cuda), or hide the GPUs "
                '(CUDA_VISIBLE_DEVICES="") from the driver and every Ray node'
            )
        return DeviceChoice(CPU, f"{ENV_DEVICE}=cpu")
    if driver_cuda:
        return DeviceChoice(CUDA, "the driver's torch sees CUDA")
    address = cluster_address(env)
    if address is None:
        return DeviceChoice(CPU, "the driver's torch sees no CUDA and starts its own Ray on this machine")
    nodes = (ask_cluster or cluster_nodes)(address)
    gpus = detected_gpus(nodes)
    if gpus:
        return DeviceChoice(CUDA, f"the Ray cluster at {address} has {gpus:g} GPUs that Ray detected")
    stand_ins = sum(float((n.get("Resources") or {}).get("GPU", 0)) for n in nodes if n.get("Alive", True))
    return DeviceChoice(
        CPU,
        f"the driver's torch sees no CUDA and the Ray cluster at {address} has no GPU that Ray detected "
        f"({stand_ins:g} GPU resources given by hand, taken as stand-ins)",
    )


def check_worker(
    cuda_available: Callable[[], bool] | None = None, environ: Mapping[str, str] | None = None
) -> None:
    """In a Ray worker of a run the driver decided ``cpu`` (rule 3): refuse to start where CUDA is seen."""
    if not (cuda_available or _torch_sees_cuda)():
        return
    env = os.environ if environ is None else environ
    raise DeviceMismatch(
        f"this Ray worker (host {socket.gethostname()}, pid {os.getpid()}) sees CUDA, but the driver "
        f"decided this is a CPU run ({ENV_DEVICE}={env.get(ENV_DEVICE) or AUTO} there) and handed it the "
        "CPU layer (stand-in GPUs, a CPU device mesh, sdpa, gloo weight sync), which must not run on a "
        f"GPU. Start the driver with {ENV_DEVICE}=cuda (or where its torch sees CUDA, or with "
        f"{RAY_ADDRESS} set to a cluster whose GPUs Ray detected) so that no CPU patch is applied"
    )
