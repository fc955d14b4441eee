"""CPU seconds per step of a pipeline benchmark run: a load-robust companion of the wall-clock steps.

    python benchmarks/pipeline_cputime.py --name cpu_grpo --rates none
    python benchmarks/pipeline_cputime.py --name cpu_dppo_05_05 --rates 0.5 0.5
    python benchmarks/pipeline_cputime.py --table runs/pipeline/cpu_grpo runs/pipeline/cpu_dppo_05_05

Launches ``benchmarks/pipeline_step.py run`` (same flags) and samples, every 0.2 s, the summed user +
system CPU time of the whole process tree (CLI, Ray, actors, vLLM). Each step's CPU seconds are read
off that curve between the step's start (``time - timing/step_total``) and end (``time``) in
metrics.jsonl. On a shared machine the wall time of a step depends on how much of the CPU others
take; the CPU time it consumes much less (spin-waits and cache effects remain).
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from openrlhf_dppo import run_dir as R  # noqa: E402 - the one reader of metrics.jsonl and its keys


def tree_cpu(root: psutil.Process, seen: dict[int, float]) -> float:
    """Cumulative CPU seconds of root and its descendants; exited processes keep their last value."""
    for p in [root] + root.children(recursive=True):
        try:
            t = p.cpu_times()
            seen[p.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return sum(seen.values())


def record(args) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "pipeline_step.py"), "run", "--name", args.name]
    cmd += ["--rates", *args.rates, "--steps", str(args.steps)]
    proc = psutil.Popen(cmd, cwd=ROOT)
    seen: dict[int, float] = {}
    samples = []
    while proc.poll() is None:
        samples.append((time.time(), tree_cpu(proc, seen)))
        time.sleep(0.2)
    (ROOT / "runs" / "pipeline" / args.name / "cpu_samples.json").write_text(json.dumps(samples))
    sys.exit(proc.returncode)


def cpu_at(samples, t: float) -> float:
    times = [s[0] for s in samples]
    i = min(max(bisect.bisect_left(times, t), 1), len(samples) - 1)
    (t0, c0), (t1, c1) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1


def table(runs: list[str], warmup: int) -> None:
    print(
        "| run | steps used | median wall step (s) | median CPU s per step | CPU / wall | median tokens trained |"
    )
    print("|---|---|---|---|---|---|")
    med = {}
    for run in runs:
        samples = json.loads((Path(run) / "cpu_samples.json").read_text())
        rows = R.last_per_step(R.read_metrics(run), R.TRAIN)[warmup:]
        cpu = [cpu_at(samples, r[R.TIME]) - cpu_at(samples, r[R.TIME] - r[R.STEP_TOTAL]) for r in rows]
        wall = [r[R.STEP_TOTAL] for r in rows]
        med[run] = statistics.median(cpu)
        print(
            f"| {Path(run).name} | {len(rows)} | {statistics.median(wall):.2f} | {med[run]:.2f} | "
            f"{statistics.median(c / w for c, w in zip(cpu, wall)):.2f} | "
            f"{statistics.median(r[R.TOKENS_TRAINED] for r in rows):.0f} |"
        )
    base = runs[0]
    for run in runs[1:]:
        print(f"\nCPU-time step ratio {Path(run).name} / {Path(base).name}: {med[run] / med[base]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name")
    ap.add_argument("--rates", nargs="+")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--table", nargs="+", help="run directories; the first is the baseline")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    if args.table:
        table(args.table, args.warmup)
    else:
        record(args)


if __name__ == "__main__":
    main()
