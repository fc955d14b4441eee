"""A tiny GRPO step in each CPU precision, on this CPU and on an emulated CPU without native bf16.

    python benchmarks/precision_step.py matmul                  # does the emulation turn bf16 off?
    python benchmarks/precision_step.py run --arm native-bf16 [--steps 6] [--round 1]
    python benchmarks/precision_step.py table runs/precision/*

``matmul`` times a 512x256 @ 256x768 matmul and ``nn.Linear`` 256->768 on a 512-row batch in fp32, bf16
and fp16 with 2 threads (GFLOP/s, best of 1 s of repeats), on this CPU, with each cap alone and with
both, each in a fresh process (the caps are read when torch loads).

``run`` is one short ``examples/scripts/train_tiny_cpu.sh`` GRPO run (the demo's flags: 64 prompts x 8
samples; ``EVAL_STEPS=-1``: no evaluation) with ``PRECISION`` and,
for the ``emulated-*`` arms, ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN then has no
bf16 kernel: what an AVX2-only CPU such as AMD Zen 3 gives). Arms: native-bf16, native-fp32,
emulated-bf16 (the old behaviour there), emulated-fp32 (the new one). Interleave arms and rounds: the
machine's load moves every arm alike only when they alternate.

``table`` prints one markdown row per run directory: the machine record (CPU model, native bf16,
precision), the median step time over steps after the first (which includes one-off warm-up), its
range, and the median shares of ``timing/generation`` and ``timing/ppo_train`` in the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openrlhf_dppo import run_dir as rd  # noqa: E402

RUNS = ROOT / "runs" / "precision"
EMULATE_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
ARMS = {
    "native-bf16": ({}, "bf16"),
    "native-fp32": ({}, "fp32"),
    "emulated-bf16": (EMULATE_AVX2, "bf16"),
    "emulated-fp32": (EMULATE_AVX2, "fp32"),
}


MATMUL_CODE = """
import time, torch
torch.set_num_threads(2)
def gflops(dtype, linear):
    x = torch.randn(512, 256, dtype=dtype)
    w = torch.randn(256, 768, dtype=dtype)
    f = (lambda m=torch.nn.Linear(256, 768).to(dtype): m(x)) if linear else (lambda: x @ w)
    for _ in range(3):
        f()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        f(); n += 1
    return 2 * 512 * 256 * 768 * n / (time.perf_counter() - t0) / 1e9
with torch.no_grad():
    cells = [f"{gflops(d, lin):.1f}" for d in (torch.float32, torch.bfloat16, torch.float16) for lin in (False, True)]
bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
print(f"{torch.backends.cpu.get_cpu_capability()} | {bf16} | " + " | ".join(cells))
"""


def matmul(args) -> None:
    print(
        "| caps | torch CPU capability | oneDNN bf16 | fp32 matmul | fp32 Linear | bf16 matmul | bf16 Linear "
        "| fp16 matmul | fp16 Linear |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for caps in ({}, {"ATEN_CPU_CAPABILITY": "avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, EMULATE_AVX2):
        env = {k: v for k, v in os.environ.items() if k not in EMULATE_AVX2}
        env.update(caps)
        out = subprocess.run(
            [sys.executable, "-c", MATMUL_CODE], env=env, capture_output=True, text=True, check=True
        )
        name = " ".join(f"{k}={v}" for k, v in caps.items()) or "none (this CPU)"
        print(f"| {name} | {out.stdout.strip()} |")


def run(args) -> None:
    caps, precision = ARMS[args.arm]
    out = RUNS / f"{args.arm}_r{args.round}"
    env = {k: v for k, v in os.environ.items() if k not in EMULATE_AVX2}
    env.update(caps)
    env.update(ALGO="grpo", PRECISION=precision, STEPS=str(args.steps), EVAL_STEPS="-1", OUT=str(out))
    subprocess.run(["bash", str(ROOT / "examples/scripts/train_tiny_cpu.sh")], cwd=ROOT, env=env, check=True)


def summary(path: Path) -> dict:
    config = json.loads((path / rd.RUN_CONFIG).read_text())
    machine = config.get(rd.MACHINE) or {}
    rows = rd.last_per_step(rd.read_metrics(path), rd.TRAIN)[1:]  # step 1 holds the one-off warm-up
    steps = [rd.number(r.get(rd.STEP_TOTAL)) or 0.0 for r in rows]

    def share(key):
        return statistics.median((rd.number(r.get(key)) or 0.0) / s for r, s in zip(rows, steps) if s)

    return {
        "run": path.name,
        "cpu": machine.get(rd.MACHINE_CPU_MODEL),
        "native_bf16": machine.get(rd.MACHINE_CPU_NATIVE_BF16),
        "caps": " ".join(f"{k}={v}" for k, v in (machine.get(rd.MACHINE_ISA_CAPS) or {}).items()) or "-",
        "precision": machine.get(rd.MACHINE_PRECISION),
        "n": len(steps),
        "median": statistics.median(steps) if steps else float("nan"),
        "min": min(steps, default=float("nan")),
        "max": max(steps, default=float("nan")),
        "gen": share(rd.GENERATION) if steps else float("nan"),
        "train": share(rd.PPO_TRAIN) if steps else float("nan"),
    }


def table(args) -> None:
    print(
        "| run | CPU | native bf16 | ISA caps | precision | steps | median step s | range s | generation | ppo_train |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in args.runs:
        s = summary(Path(path))
        print(
            f"| {s['run']} | {s['cpu']} | {s['native_bf16']} | {s['caps']} | {s['precision']} | {s['n']} | "
            f"{s['median']:.2f} | {s['min']:.2f}-{s['max']:.2f} | {s['gen']:.0%} | {s['train']:.0%} |"
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--arm", choices=ARMS, required=True)
    r.add_argument("--steps", type=int, default=6)
    r.add_argument("--round", type=int, default=1)
    sub.add_parser("matmul")
    t = sub.add_parser("table")
    t.add_argument("runs", nargs="+")
    args = ap.parse_args(argv)
    {"run": run, "table": table, "matmul": matmul}[args.cmd](args)


if __name__ == "__main__":
    main()
