"""GPU smoke, stage (a) and the check after the carry stage: what this machine has, as JSON.

    python benchmarks/gpu_smoke/probe.py --json OUT/probe.json --label image [--device cuda]
    python benchmarks/gpu_smoke/probe.py --json OUT/probe.json --label smoke --host

Each call adds one section, ``--label``, to the JSON file (the others are kept): the GPU as nvidia-smi
and torch see it, nvcc and ninja (DeepSpeed's JIT builds), and for each module of ``MODULES`` whether
it imports, its version, where from, and whether it is one of the smoke's stand-ins. ``--host`` also
imports the modules the actor path needs (``HOST_MODULES``) after ``openrlhf_dppo._host.prepare_host()``.
Exit status 1 when ``--device cuda`` and torch sees no CUDA device, or a ``--host`` import fails;
the reason is printed and in the section's ``problems``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

MODULES = (
    "torch", "transformers", "tokenizers", "openrlhf", "deepspeed", "ray", "vllm", "flash_attn",
    "pydantic", "torchdata", "pylatexenc", "hjson", "peft", "accelerate", "pytest",
)  # fmt: skip
DISTRIBUTIONS = {"flash_attn": "flash-attn"}
HOST_MODULES = (
    "openrlhf.trainer.ppo_utils.experience",
    "openrlhf.trainer.ray.ppo_actor",
    "openrlhf.utils.deepspeed",
    "openrlhf_dppo.adapters.actor",
    "openrlhf_dppo.adapters.dispatch",
)


def command(argv: list[str]) -> str | None:
    """The command's output, stripped, or None when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def module_facts(name: str) -> dict:
    try:
        mod = importlib.import_module(name)
    except Exception as err:  # any import failure is a finding, not a crash of the probe
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    try:
        version = metadata.version(DISTRIBUTIONS.get(name, name))
    except metadata.PackageNotFoundError:
        version = getattr(mod, "__version__", None)
    path = getattr(mod, "__file__", None)
    return {"ok": True, "version": version, "path": path, "stand_in": hasattr(mod, "STAND_IN")}


def gpu_facts() -> dict:
    import torch

    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": False}
    smi = command(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    facts["nvidia_smi"] = smi
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            cuda_available=True, device_count=torch.cuda.device_count(), name=props.name,
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            memory_gib=props.total_memory / 2**30, bf16=torch.cuda.is_bf16_supported(),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )  # fmt: skip
    nvcc = command(["nvcc", "--version"])
    facts["nvcc"] = nvcc.splitlines()[-1] if nvcc else None
    facts["ninja"] = command(["ninja", "--version"])
    return facts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="the JSON file to add a section to")
    ap.add_argument("--label", required=True, help="the section's name")
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default="cpu", help="cuda: no CUDA device is a problem"
    )
    ap.add_argument("--host", action="store_true", help="also import HOST_MODULES (after prepare_host)")
    args = ap.parse_args(argv)

    section: dict = {
        "python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
        "cpus": os.cpu_count(), "pythonpath": os.environ.get("PYTHONPATH", ""), "problems": [],
    }  # fmt: skip
    section["modules"] = {name: module_facts(name) for name in MODULES}
    section["gpu"] = gpu_facts()
    if args.device == "cuda" and not section["gpu"]["cuda_available"]:
        section["problems"].append("torch sees no CUDA device")
    if args.host:
        from openrlhf_dppo._host import prepare_host

        prepare_host()
        section["host_imports"] = {name: module_facts(name) for name in HOST_MODULES}
        for name, facts in section["host_imports"].items():
            if not facts["ok"]:
                section["problems"].append(f"import {name}: {facts['error']}")

    data = {}
    if os.path.exists(args.json):
        with open(args.json) as f:
            data = json.load(f)
    data[args.label] = section
    with open(args.json, "w") as f:
        json.dump(data, f, indent=1, default=str)
    mods = section["modules"]
    shown = ", ".join(
        (f"{n} stand-in" if m["stand_in"] else f"{n} {m['version']}") if m["ok"] else f"{n} -"
        for n, m in mods.items()
        if n in ("torch", "transformers", "openrlhf", "deepspeed", "ray", "vllm", "flash_attn")
    )
    gpu = section["gpu"]
    where = f"{gpu['name']} (cc {gpu['capability']})" if gpu["cuda_available"] else "no CUDA device"
    print(f"probe {args.label}: {where}; {shown}")
    for problem in section["problems"]:
        print(f"probe {args.label}: PROBLEM {problem}")
    return 1 if section["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
