"""Where the run's workers compute, ``cpu`` or ``cuda`` (docs/DESIGN.md, "CPU path"): decided once by the
driver, checked by every worker.

  1. ``OPENRLHF_DPPO_DEVICE`` = ``auto`` (default) | ``cpu`` | ``cuda``; ``cpu`` or ``cuda`` decides
     (``cpu`` is refused on a driver that sees CUDA);
  2. ``auto``: a driver that sees CUDA makes a ``cuda`` run; one that starts its own Ray a ``cpu`` run;
     one that joins a cluster (``RAY_ADDRESS``) asks it: ``cuda`` when a live node has GPUs Ray
     detected, else ``cpu`` (GPUs given by hand to ``ray start --num-gpus`` are stand-ins);
  3. every Ray worker of a ``cpu`` run that sees CUDA refuses to start (``check_worker``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from openrlhf_dppo.compat.cpu.hooks import ENV_DEVICE

AUTO, CPU, CUDA = "auto", "cpu", "cuda"
CHOICES = (AUTO, CPU, CUDA)
RAY_ADDRESS = "RAY_ADDRESS"
DETECTED_TYPE_RESOURCE = "accelerator_type:"  # Ray adds "accelerator_type:<type>" for the GPUs it detects
DETECTED_TYPE_LABEL = "ray.io/accelerator-type"  # and, in newer Ray, this node label
ASK_TIMEOUT_S = 60.0  # how long the cluster has to answer (a child process: connecting, ray.nodes())
CONNECT_TIMEOUT_S = 10.0  # the TCP check that something listens at host:port, before that
_ANSWER = "openrlhf-dppo nodes: "  # the child's line that carries the answer
# the child: connect, print the live records' fields decide() reads, and leave (its exit disconnects)
_ASK = f"""
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
nodes = [{{k: n.get(k) for k in ("Alive", "Resources", "Labels")}} for n in ray.nodes()]
print({_ANSWER!r} + json.dumps(nodes), flush=True)
"""


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


def cluster_nodes(address: str, timeout_s: float = ASK_TIMEOUT_S) -> list[dict]:
    """``ray.nodes()`` of the cluster at ``address`` (the fields ``decide`` reads), asked by a child process
    given ``timeout_s``. Raises DeviceChoiceError naming ``RAY_ADDRESS``, the reason and the way out."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.nodes()

    def fail(why: str) -> DeviceChoiceError:
        return DeviceChoiceError(
            f"{RAY_ADDRESS}={address!r}: could not ask the Ray cluster whether it has GPUs ({why}); "
            f"set {ENV_DEVICE}=cuda or {ENV_DEVICE}=cpu to decide without asking"
        )

    endpoint = _host_port(address)
    if endpoint is not None:
        try:
            socket.create_connection(endpoint, timeout=min(CONNECT_TIMEOUT_S, timeout_s)).close()
        except OSError as err:
            raise fail(f"nothing answers at {endpoint[0]}:{endpoint[1]}: {err}") from err
    proc = subprocess.Popen(
        [sys.executable, "-c", _ASK, address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
        proc.communicate()
        raise fail(f"no answer within {timeout_s:g} s: is a Ray cluster running there?") from None
    answers = [line[len(_ANSWER) :] for line in out.splitlines() if line.startswith(_ANSWER)]
    if proc.returncode != 0 or not answers:
        last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "")
        raise fail(last or f"the asking process exited with status {proc.returncode}")
    return json.loads(answers[-1])


def _host_port(address: str) -> tuple[str, int] | None:
    """("host", port) of ``host:port`` or ``ray://host:port``; None for what Ray resolves itself (``auto``)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _torch_sees_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def decide_locally(
    environ: Mapping[str, str] | None = None, cuda_available: Callable[[], bool] | None = None
) -> DeviceChoice | None:
    """The decision where nothing needs asking; None: the cluster at ``RAY_ADDRESS`` must be asked
    (``decide``). environ: the driver's (None: ``os.environ``); cuda_available: None asks torch."""
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
    if cluster_address(env) is None:
        return DeviceChoice(CPU, "the driver's torch sees no CUDA and starts its own Ray on this machine")
    return None


def decide(
    environ: Mapping[str, str] | None = None,
    cuda_available: Callable[[], bool] | None = None,
    ask_cluster: Callable[[str], list[dict]] | None = None,
) -> DeviceChoice:
    """Where this run's workers compute: ``decide_locally``, else the cluster at ``RAY_ADDRESS`` is asked
    (``ask_cluster``: address -> ``ray.nodes()``; None: ``cluster_nodes``)."""
    env = os.environ if environ is None else environ
    local = decide_locally(env, cuda_available)
    if local is not None:
        return local
    address = cluster_address(env)
    assert address is not None  # decide_locally decides every run that starts its own Ray
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
