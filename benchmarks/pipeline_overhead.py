"""DPPO's own work per step at the shapes of the pipeline benchmark, as a share of its measured step.

    python benchmarks/pipeline_overhead.py --run runs/pipeline/dppo_05_05 [--repeats 200]

The pipeline logs no timing of the DPPO core calls, so they are timed here on the batch shapes of
``benchmarks/pipeline_step.py`` (B = 8 prompts x G = 8 completions drawn from 16 known prompts,
geometric completion lengths of mean ~90 capped at 128, token budget 2048, one rank, r_q = r_o = 0.5)
with the step function of ``benchmarks/core_overhead.py`` (history score and update, prompt keep
probabilities and draw, advantages, completion keep probabilities and draw, weights, packing). The
share is the median of these over the median ``timing/step_total`` of the given DPPO run (steps after
the first two). Wall times on the shared machine include preemption, so the CPU time
(``time.process_time``) of the whole step is given too. One torch thread, as in the pipeline's actor on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import core_overhead  # noqa: E402 - the step function of the core benchmark, reused at other shapes

from openrlhf_dppo import run_dir as R  # noqa: E402 - the one reader of metrics.jsonl and its keys
from openrlhf_dppo.core import PromptHistory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/pipeline/dppo_05_05")
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    core_overhead.B, core_overhead.G, core_overhead.CAPACITY, core_overhead.DP = 8, 8, 2048, 1
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    history = PromptHistory(capacity=16)
    times: dict[str, list[float]] = {}
    totals, cpu_totals = [], []
    for step in range(args.repeats + 3):
        idx = torch.from_numpy(rng.choice(16, 8, replace=False))
        rewards = torch.from_numpy((rng.random((8, 8)) < 0.5).astype(np.float32))
        lengths = np.minimum(rng.geometric(1 / 90, (8, 8)), 128) + 6
        step_times: dict[str, list[float]] = {}
        t, c = time.perf_counter(), time.process_time()
        core_overhead.one_step(history, idx, rewards, lengths, step, step_times)
        total, cpu = (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3
        if step >= 3:  # the first steps fill the history and warm up the code paths
            totals.append(total)
            cpu_totals.append(cpu)
            for k, v in step_times.items():
                times.setdefault(k, []).extend(v)
    rows = R.last_per_step(R.read_metrics(args.run), R.TRAIN)
    steps = [r[R.STEP_TOTAL] for r in rows][2:]
    step_ms = statistics.median(steps) * 1e3
    print(f"| part | median ms | share of the median DPPO step ({step_ms / 1e3:.2f} s, {args.run}) |")
    print("|---|---|---|")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.3f} | {m / step_ms:.4%} |")
    parts = sum(statistics.median(v) for v in times.values())
    print(f"| sum of the part medians | {parts:.3f} | {parts / step_ms:.4%} |")
    m, c = statistics.median(totals), statistics.median(cpu_totals)
    print(f"| **total (one step), wall** | **{m:.3f}** | **{m / step_ms:.4%}** |")
    print(f"| total (one step), CPU time | {c:.3f} | {c / step_ms:.4%} |")


if __name__ == "__main__":
    main()
