"""The warm start's arithmetic (benchmarks/INFRA.md, "Warm start"): with ``WARM["arithmetic"] == "avx2"``
the build runs under ``PINNED_ENV`` (ATen's kernels and MKL's code path at AVX2), in a child process
when this one is not; ``arithmetic=None``: this process's own kernels (quick tests).
"""

from __future__ import annotations

import hashlib
import json
import os

PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
# set in the child: it builds with what it got, never forks again
_CHILD_ENV = "OPENRLHF_DPPO_TINY_BUILD_CHILD"


def arithmetic_used() -> dict:
    """What this process computes the warm start with: torch's CPU kernel level and MKL's code path."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    mkl = os.environ.get("MKL_CBWR", "")
    return {"torch_cpu_capability": cap, "mkl_cbwr": mkl, "pinned_avx2": cap == "AVX2" and mkl == "AVX2"}


def needs_pinned_child(warm: dict) -> bool:
    """True when ``warm`` asks for the pinned arithmetic and this process, not already the child made
    for it, does not have it."""
    if warm.get("arithmetic") != "avx2" or os.environ.get(_CHILD_ENV):
        return False
    return not arithmetic_used()["pinned_avx2"]


def build_in_pinned_child(
    out: str, seed: int, warm: dict, size: str, task_name: str, extra: dict | None = None
):
    """Run this build in ``python -m openrlhf_dppo.tiny.build`` under ``PINNED_ENV``; return its info.

    ``extra``: keyword arguments of the task's build function beyond (out, seed, warm, size), as JSON."""
    import subprocess
    import sys

    spec = json.dumps({"warm": warm, "extra": extra or {}})
    cmd = [sys.executable, "-m", "openrlhf_dppo.tiny.build", "--out", out, "--seed", str(seed)]
    cmd += ["--size", size, "--task", task_name, "--force", "--spec", spec]
    env = {**os.environ, **PINNED_ENV, _CHILD_ENV: "1"}
    proc = subprocess.run(cmd, env=env)
    if proc.returncode:
        raise RuntimeError(
            f"the tiny build in a child process failed (exit {proc.returncode}): {' '.join(cmd)}"
        )
    with open(os.path.join(out, "build_info.json")) as f:
        return json.load(f)


def weights_digest(model) -> str:
    """sha256 of every parameter and buffer of ``model`` (state_dict order by name), as trained."""
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
