"""Packing benchmark: the window packer vs OpenRLHF 0.11.2's dynamic-batch partitioning vs
padding, on long-tailed chain-of-thought lengths, before and after 50% pruning.

Lengths: prompts of U[64, 512] tokens, 8 completions each with log-normal response lengths (median
1500, sigma 0.9) capped at 8192 new tokens; capacity 16384 tokens per micro-batch, dp_size 8.

Also "window, no fill (paper)": our window packer without its fill-on-close step, i.e. the paper's
plain window-based greedy best fit (W = 8).

Baselines, both as the host runs them for one training step:
- OpenRLHF ("orl"): every rank holds its contiguous share of the sequences; micro-batch count per rank =
  ``get_minimum_num_micro_batch_size`` (first fit in arrival order), maxed over ranks, then
  ``get_seqlen_balanced_partitions`` (Karmarkar-Karp) into that many micro-batches per rank. Karmarkar-
  Karp keeps k sets per item, so it is run only where n_per_rank * k stays below 5e6 sets.
- padding: per rank, micro-batches of b sequences in arrival order, b = capacity // (longest sequence
  of the step), each padded to its longest member.

Usage: python benchmarks/core_packing.py [--sizes 10000 100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from openrlhf_dppo.core import pack
from openrlhf_dppo.core.packing import distribute, window_best_fit
from openrlhf_dppo.metric_keys import PACK_DENSITY, PACK_LOWER_BOUND

CAPACITY, DP, GROUP = 16_384, 8, 8


def cot_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_prompts = -(-n // GROUP)
    prompt = np.repeat(rng.integers(64, 513, n_prompts), GROUP)[:n]
    response = np.minimum(rng.lognormal(np.log(1500), 0.9, n).astype(np.int64) + 1, 8192)
    return prompt + response


def _summary(name, rank_mbs, lengths, seconds, lower, cpu_seconds=None):
    loads = [[int(lengths[mb].sum()) if len(mb) else 0 for mb in rank] for rank in rank_mbs]
    k = max(len(r) for r in rank_mbs)
    total = int(lengths.sum())
    rank_tokens = [sum(r) for r in loads]
    return {
        "method": name,
        "density": total / (k * DP * CAPACITY),
        "mb_per_rank": k,
        "lower_bound": lower,
        "imbalance": max(rank_tokens) / (total / DP),
        "max_mb_over_capacity": max(max(r) for r in loads if r) / CAPACITY,
        "ms": seconds * 1e3,
        "cpu_ms": (cpu_seconds if cpu_seconds is not None else seconds) * 1e3,
    }


def run_ours(lengths, repeats):
    times, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        plan, m = pack(lengths, CAPACITY, DP)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    rank_mbs = [[np.asarray(mb, dtype=np.int64) for mb in r] for r in plan.rank_micro_batches]
    lower = int(m[PACK_LOWER_BOUND])
    out = _summary("window", rank_mbs, lengths, statistics.median(times), lower, statistics.median(cpu))
    out["min_ms"] = min(times) * 1e3
    assert abs(out["density"] - m[PACK_DENSITY]) < 1e-12
    return out


def run_plain_window(lengths, lower):
    """The paper's window without the fill-on-close step (``window_best_fit(fill_on_close=False)``)."""
    t, c = time.perf_counter(), time.process_time()
    bins, loads = window_best_fit(lengths, CAPACITY, fill_on_close=False)
    ranks, _, _ = distribute(bins, loads, lengths, DP)
    seconds, cpu = time.perf_counter() - t, time.process_time() - c
    rank_mbs = [[np.asarray(mb, dtype=np.int64) for mb in r] for r in ranks]
    return _summary("window, no fill (paper)", rank_mbs, lengths, seconds, lower, cpu)


def run_openrlhf(lengths, lower):
    from openrlhf.utils.seqlen_balancing import (
        get_minimum_num_micro_batch_size,
        get_seqlen_balanced_partitions,
    )

    shares = np.array_split(np.arange(lengths.size), DP)
    t, c = time.perf_counter(), time.process_time()
    k = max(get_minimum_num_micro_batch_size(lengths[s].tolist(), CAPACITY, 1, 1) for s in shares)
    if max(len(s) for s in shares) * k > 5e6:
        return {"method": "openrlhf", "skipped": f"Karmarkar-Karp would hold {len(shares[0]) * k:.2e} sets"}
    rank_mbs = []
    for s in shares:
        parts = get_seqlen_balanced_partitions(lengths[s].tolist(), k, equal_size=False)
        rank_mbs.append([s[np.asarray(p, dtype=np.int64)] for p in parts])
    return _summary("openrlhf", rank_mbs, lengths, time.perf_counter() - t, lower, time.process_time() - c)


def run_padding(lengths, lower):
    t, c = time.perf_counter(), time.process_time()
    b = max(1, CAPACITY // int(lengths.max()))
    rank_mbs, padded = [], 0
    for s in np.array_split(np.arange(lengths.size), DP):
        mbs = [s[i : i + b] for i in range(0, len(s), b)]
        padded += sum(len(mb) * int(lengths[mb].max()) for mb in mbs)
        rank_mbs.append(mbs)
    k = max(len(r) for r in rank_mbs)
    out = _summary("padding", rank_mbs, lengths, time.perf_counter() - t, lower, time.process_time() - c)
    out["real_over_padded"] = float(lengths.sum()) / padded
    out["mb_per_rank"] = k
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for n in args.sizes:
        full = cot_lengths(n)
        pruned = full[np.random.default_rng(1).random(n) >= 0.5]
        for label, lengths in (("none", full), ("50%", pruned)):
            ours = run_ours(lengths, args.repeats)
            for res in (
                ours,
                run_plain_window(lengths, ours["lower_bound"]),
                run_openrlhf(lengths, ours["lower_bound"]),
                run_padding(lengths, ours["lower_bound"]),
            ):
                res.update(n=n, n_seq=int(lengths.size), pruning=label)
                rows.append(res)
                print(json.dumps(res), flush=True)
    print()
    print(
        "| n drawn | sequences | method | density | micro-batches / rank (lower bound) | imbalance "
        "| max mb / C | wall ms (median / min) | CPU ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['n']} | {r['n_seq']} | {r['method']} | — | — | — | — | not run: {r['skipped']} | |")
            continue
        print(
            f"| {r['n']} | {r['n_seq']} | {r['method']} | {r['density']:.3f} | {r['mb_per_rank']} "
            f"({r['lower_bound']}) | {r['imbalance']:.3f} | {r['max_mb_over_capacity']:.3f} | {r['ms']:.0f}"
            + (f" / {r['min_ms']:.0f}" if "min_ms" in r else "")
            + " "
            f"| {r['cpu_ms']:.0f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
