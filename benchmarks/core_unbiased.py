"""Unbiasedness table: bias of the pruned-and-reweighted gradient in standard errors, and the variance
inflation, per level, prompt policy (every registered one) and pruning rate, with the systematic draw
(the Monte-Carlo toy of ``tests/core/dppo_mc_sim.py``: B = 6 prompts, one never seen, G = 4, a 3-token
softmax policy).

Columns: max |z| over the 3 gradient coordinates of mean(g_hat - g) / SE (unbiased: below 4 expected);
the same for the kept-count normalised control (biased); Var ratio = trace Var(g_hat) / trace Var(g)
next to 1/(1-r); the realised fraction of completions trained.

Usage: python benchmarks/core_unbiased.py [--replicates 20000] [--levels completion] [--policies uniform]
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))
from dppo_mc_sim import Toy, simulate  # noqa: E402

from openrlhf_dppo.core import PROMPT_POLICIES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicates", type=int, default=20000)
    ap.add_argument("--levels", nargs="+", default=["both", "prompt", "completion"])
    ap.add_argument("--policies", nargs="+", default=PROMPT_POLICIES.names(), help="default: every one")
    ap.add_argument("--rates", nargs="+", type=float, default=[0.3, 0.5, 0.7, 0.9])
    args = ap.parse_args()
    torch.set_num_threads(1)
    toy = Toy()
    print(
        "| level | prompt policy | r | max abs z (ours) | max abs z (kept-count control) | Var ratio | 1/(1-r) "
        "| trained frac |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for level in args.levels:
        # the completion level alone draws no prompts: one row per rate
        for policy in args.policies if level != "completion" else ["-"]:
            for r in args.rates:
                res = simulate(
                    toy,
                    args.replicates,
                    level,
                    r,
                    multiple_of=2,  # the systematic draw keeps an exact count
                    seed=zlib.crc32(repr((level, policy, r)).encode()),
                    prompt_policy=policy if policy != "-" else "proportional",
                )
                print(
                    f"| {level} | {policy} | {r} | {res.z.abs().max():.2f} "
                    f"| {res.z_kept_count.abs().max():.1f} | {res.var_ratio:.2f} | {1 / (1 - r):.2f} "
                    f"| {res.keep_frac:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
