"""Overhead of the DPPO core for one step of 1024 prompts x 8 completions (CPU, one torch thread):
history update + prompt scores and keep probabilities + prompt draw + advantages + completion keep
probabilities + completion draw + weights + packing the kept sequences (capacity 16384, dp 8).
Median over repeats, in milliseconds.

Usage: python benchmarks/core_overhead.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from openrlhf_dppo.core import (
    PromptHistory,
    completion_keep_probs,
    group_advantages,
    inverse_prob_weights,
    pack,
    prompt_keep_probs,
    sample_mask,
    step_generator,
    weight_metrics,
)

B, G, CAPACITY, DP = 1024, 8, 16_384, 8


def one_step(history, idx, rewards, lengths, step, times):
    def timed(name, fn):
        t = time.perf_counter()
        out = fn()
        times.setdefault(name, []).append((time.perf_counter() - t) * 1e3)
        return out

    signals = timed("prompt score", lambda: history.signals(idx, G))
    q, _ = timed(
        "prompt keep probs", lambda: prompt_keep_probs(signals.score, 0.5, 0.1, unseen=signals.unseen)
    )
    pmask, q_used = timed("prompt draw", lambda: sample_mask(q, step_generator(0, step, 0), DP))
    kept = torch.nonzero(pmask).flatten()
    r = rewards[kept]
    timed("history update", lambda: history.update(idx[kept], r, step))
    adv = timed("advantages", lambda: group_advantages(r)).reshape(-1)
    p, _ = timed("completion keep probs", lambda: completion_keep_probs(adv, 0.5, 0.1, True))
    cmask, p_used = timed("completion draw", lambda: sample_mask(p, step_generator(0, step, 1), DP))

    def weights():
        w = inverse_prob_weights(p_used, cmask) * (1.0 / q_used[kept]).repeat_interleave(G)
        return weight_metrics(w[cmask])

    timed("weights", weights)
    kept_lengths = lengths[kept].reshape(-1)[cmask.numpy()]
    timed("pack", lambda: pack(kept_lengths, CAPACITY, DP))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    history = PromptHistory(capacity=100_000)
    times: dict[str, list[float]] = {}
    totals = []
    for step in range(args.repeats + 3):
        idx = torch.from_numpy(rng.choice(100_000, B, replace=False))
        succ = rng.beta(0.5, 0.5, B)[:, None]
        rewards = torch.from_numpy((rng.random((B, G)) < succ).astype(np.float32))
        lengths = np.minimum(rng.lognormal(np.log(1500), 0.9, (B, G)).astype(np.int64) + 1, 8192) + 256
        before = {k: len(v) for k, v in times.items()}
        t = time.perf_counter()
        one_step(history, idx, rewards, lengths, step, times)
        totals.append((time.perf_counter() - t) * 1e3)
        if step < 3:  # warm-up steps (also fill the history so that scores are not all unseen)
            for k, n in before.items():
                del times[k][n:]
            for k in list(times):
                if k not in before:
                    del times[k]
            totals.pop()
    print("| part | median ms |")
    print("|---|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.2f} |")
    print(f"| **total (one step)** | **{statistics.median(totals):.2f}** |")


if __name__ == "__main__":
    main()
