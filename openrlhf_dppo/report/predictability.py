"""How well a prompt's history predicts its groups without gradient, and what prompt pruning at a given
rate could keep of a GRPO batch's gradient with that prediction.

    python -m openrlhf_dppo.report.predictability --arm grpo='runs/x/grpo_s*' [--rates 0.33,0.5] \
        [--history 0.5:1 --history 0:1 ...] [--first-step 1] [--reward-kind auto]

The runs must be GRPO runs (``--dppo.enable false``) made with ``--dppo.prompt_log true``: their
prompts.jsonl holds every drawn prompt's group, with its dataset index and its G raw rewards, step by
step. The script replays each run's steps through the project's own prompt history
(``core.PromptHistory``, one per predictor): before each step's update it scores the step's prompts,
exactly as a DPPO draw at that step would have from the same past, and then draws the keep
probabilities the DPPO draw would use (``core.prompt_keep_probs``: q = clip(c x score, q_min, 1) with
the expected kept fraction 1 - r, unseen prompts scored like an average seen one as under
``--dppo.unseen_prompts mean``). Nothing is trained: it asks what each predictor would have chosen on
GRPO's own trajectory (a DPPO run's history is sparser: it sees only what it rolled out).

A group whose G rewards are all equal has no policy gradient under GRPO's estimator; every other group
carries some. Per predictor and policy, pooled over the run's steps from ``--first-step`` on:

- AUC: the probability that a gradient-carrying group of a seen prompt scored higher than an
  all-equal one (ties count a half): 0.5 is no better than chance, 1 a perfect predictor;
- at each rate r, the all-equal share of the groups it would roll out (sum of q over the all-equal
  groups / sum of q), against the batch's own share;
- kept: the expected share of the gradient-carrying groups it would roll out (sum of q over them / their
  count);
- effective: the harmonic mean of q over the gradient-carrying groups, n / sum(1/q). A kept group's
  gradient is weighted 1/q, so the Horvitz-Thompson estimate of the batch's gradient has the variance
  of a plain uniform subsample of that share of the gradient-carrying groups (when their gradients are
  alike in size and noise): the share of GRPO's gradient groups the pruned step is worth.

Rows: a uniform draw (q = 1 - r for every prompt: kept = effective = 1 - r); each ``--history
DECAY:PRIOR`` (the history's ``--dppo.history_decay`` and ``--dppo.history_prior``; the project's score
s = 1 - p^G - (1 - p)^G, p the discounted Beta posterior mean, or the reward std: see ``--reward-kind``)
with q proportional to s (the project's rule) and to sqrt(s) (the rule that minimises that variance for
a fixed budget when s is the probability that the group carries gradient: minimise sum_j s_j / q_j
subject to sum_j q_j = K) and, as the most that score can give, q proportional to sqrt(P) with P the
share of gradient-carrying groups among the groups in the same decile of the score, fitted on the same
run ("calibrated in-sample": an optimistic bound, since it uses the outcomes it is scored on); and the
oracle (a score of 1 for the gradient-carrying groups, 0 for the others: q_min on those), the most any
predictor can keep at that rate with the floor q_min. Mean ± sd (min–max) over the runs.
``--reward-kind`` is the histories' ``--dppo.reward_kind``: auto (the default) takes the reward std as the
score as soon as a reward outside {0, 1} is seen (countdown's 0.05 for a well-formed wrong answer), binary
keeps the success-based score.
"""

from __future__ import annotations

import argparse
import glob
import sys

import numpy as np
import torch

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.core.history import REWARD_KINDS, PromptHistory
from openrlhf_dppo.core.keep_probs import prompt_keep_probs
from openrlhf_dppo.report.curves import Spread
from openrlhf_dppo.report.selection import auc, read_steps
from openrlhf_dppo.report.tables import fmt_spread

DEFAULT_HISTORIES = ("0.5:1", "0:1", "0.5:0.25", "0.9:1")
Q_MIN = 0.1  # --dppo.q_min's default


def parse_history(text: str) -> tuple[float, float]:
    try:
        decay, prior = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--history must be DECAY:PRIOR (e.g. 0.5:1), got {text!r}") from None
    PromptHistory(decay=decay, prior=prior)  # the history's own checks name what is wrong
    return decay, prior


def load_steps(run: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """A GRPO run's logged steps as (dataset indices (n,), rewards (n, G)) (``selection.read_steps``,
    advise's reader); refuses a run with q < 1."""
    steps, grpo = read_steps(run)
    if not grpo:
        raise ValueError(
            f"{run}: groups were rolled out with q < 1 (a DPPO run): the study needs every drawn prompt's "
            "group, from a GRPO run (--dppo.enable false --dppo.prompt_log true)"
        )
    if not steps:
        raise ValueError(f"{run}: prompts.jsonl has no trained step")
    return [(s.index, s.rewards) for s in steps]


class Tally:
    """Pooled sums of one (predictor, policy, rate) over a run's steps."""

    def __init__(self) -> None:
        self.q_equal = self.q_all = self.q_grad = self.inv_q_grad = 0.0
        self.n_grad = 0

    def add(self, q: np.ndarray, grad: np.ndarray) -> None:
        self.q_all += float(q.sum())
        self.q_equal += float(q[~grad].sum())
        self.q_grad += float(q[grad].sum())
        self.inv_q_grad += float((1.0 / q[grad]).sum())
        self.n_grad += int(grad.sum())

    def result(self) -> dict:
        return {
            "equal_rolled": self.q_equal / self.q_all,
            "kept": self.q_grad / self.n_grad if self.n_grad else float("nan"),
            "effective": self.n_grad / self.inv_q_grad if self.n_grad else float("nan"),
        }


def study_run(steps, histories, rates, first_step: int, reward_kind: str = "auto") -> dict:
    """One run: {row name: {"auc", "seen", "equal_share", rate: {equal_rolled, kept, effective}}}."""
    G = steps[0][1].shape[1]
    rows: dict[str, dict] = {}
    tallies: dict[tuple[str, float], Tally] = {}
    per_step: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}  # each history's (scores, grad) a step
    hist = {
        f"history {d:g}:{a:g}": PromptHistory(decay=d, prior=a, reward_kind=reward_kind) for d, a in histories
    }
    n_groups = n_seen = n_equal = 0

    def tally(name: str, score: np.ndarray, grad: np.ndarray, unseen_score: float | None) -> None:
        for r in rates:
            q, _ = prompt_keep_probs(torch.from_numpy(score), 1.0 - r, Q_MIN, unseen_score=unseen_score)
            tallies.setdefault((name, r), Tally()).add(q.numpy(), grad)

    for step, (index, rewards) in enumerate(steps, 1):
        grad = rewards.max(axis=1) != rewards.min(axis=1)
        if step >= first_step:
            for name, h in hist.items():
                s = h.score(
                    torch.from_numpy(index), G
                ).numpy()  # +inf: never rolled out (alike in every history)
                unseen = h.mean_seen_score(G)
                per_step.setdefault(name, []).append((s, grad))
                tally(f"{name}, q ~ s", s, grad, unseen)
                root = np.where(np.isfinite(s), np.sqrt(np.clip(s, 0.0, None)), np.inf)
                tally(f"{name}, q ~ sqrt(s)", root, grad, float(np.sqrt(unseen)))
            tally("uniform", np.ones(index.size), grad, None)
            tally("oracle", grad.astype(np.float64), grad, None)
            n_groups += index.size
            n_seen += int(np.isfinite(s).sum())
            n_equal += int((~grad).sum())
        for h in hist.values():
            h.update(torch.from_numpy(index), torch.from_numpy(rewards), step)
    if n_groups == 0:
        raise ValueError(f"no step from --first-step {first_step} on (the run has {len(steps)})")
    aucs = {}
    for name, seq in per_step.items():
        score, carries = np.concatenate([x for x, _ in seq]), np.concatenate([g for _, g in seq])
        seen = np.isfinite(score)
        aucs[f"{name}, q ~ s"] = aucs[f"{name}, q ~ sqrt(s)"] = auc(
            score[seen & carries], score[seen & ~carries]
        )
        calibrated = calibrate(score, carries)  # the score's best use: its calibrated probability, q ~ sqrt
        for s, grad in seq:
            tally(f"{name}, calibrated in-sample, q ~ sqrt(P)", np.sqrt(calibrated(s)), grad, None)
    for (name, r), t in tallies.items():
        rows.setdefault(name, {"auc": aucs.get(name)})[r] = t.result()
    meta = {
        "steps": len(steps) - first_step + 1,
        "seen": n_seen / n_groups,
        "equal_share": n_equal / n_groups,
    }
    return {"rows": rows, "meta": meta}


def calibrate(score: np.ndarray, grad: np.ndarray, bins: int = 10):
    """The share of gradient-carrying groups among the groups of each score decile (unseen prompts, score
    +inf, their own bin), fitted on the very groups it is then applied to (in-sample: a bound no real
    draw reaches, which must fix q before the outcomes). Returns score -> P(the group carries gradient),
    floored at 1e-3 so that every q stays > 0."""
    finite = np.isfinite(score)
    edges = (
        np.unique(np.quantile(score[finite], np.linspace(0, 1, bins + 1))) if finite.any() else np.zeros(1)
    )

    def bin_of(x: np.ndarray) -> np.ndarray:
        inner = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, max(len(edges) - 2, 0))
        return np.where(np.isfinite(x), inner, len(edges))

    b = bin_of(score)
    rate = np.full(len(edges) + 1, grad.mean())
    for k in np.unique(b):
        rate[k] = grad[b == k].mean()
    return lambda x: np.maximum(rate[bin_of(x)], 1e-3)


def spread(values: list[float | None], spec: str = ".3f") -> str:
    """The report's "mean ± sd (min–max)" over the runs (None or nan: no value)."""
    return fmt_spread(Spread.of(None if v is None or v != v else v for v in values), spec)


def main(argv=None, prog: str | None = None) -> dict:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arm", action="append", required=True, metavar="NAME=GLOB", help="GRPO runs with a prompt log"
    )
    ap.add_argument("--rates", default="0.33,0.5", help="prompt prune rates r, comma-separated, in (0, 1)")
    ap.add_argument(
        "--history", action="append", metavar="DECAY:PRIOR", help=f"default: {' '.join(DEFAULT_HISTORIES)}"
    )
    ap.add_argument("--first-step", type=int, default=1, help="the first step counted (the history sees all)")
    ap.add_argument(
        "--reward-kind",
        choices=REWARD_KINDS,
        default="auto",
        help="the histories' --dppo.reward_kind (its default: auto)",
    )
    args = ap.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",")]
    except ValueError:
        ap.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
    if any(not 0.0 < r < 1.0 - Q_MIN + 1e-12 for r in rates):
        ap.error(f"--rates must lie in (0, {1 - Q_MIN:g}] (q_min = {Q_MIN:g}), got {args.rates}")
    if args.first_step < 1:
        ap.error(f"--first-step must be >= 1, got {args.first_step}")
    try:
        histories = [parse_history(h) for h in (args.history or DEFAULT_HISTORIES)]
    except ValueError as err:
        ap.error(str(err))
    out = {}
    for spec in args.arm:
        name, sep, pattern = spec.partition("=")
        runs = sorted(glob.glob(pattern))
        if not sep or not name or not runs:
            ap.error(f"--arm {spec!r}: expected NAME=GLOB matching at least one run directory")
        try:
            studies = [
                study_run(load_steps(run), histories, rates, args.first_step, args.reward_kind)
                for run in runs
            ]
        except (R.RunDirError, ValueError) as err:
            ap.error(str(err))
        out[name] = studies
        metas = [s["meta"] for s in studies]
        print(
            f"\n{name}: {len(runs)} runs, {spread([m['steps'] for m in metas], '.0f')} steps from step "
            f"{args.first_step}; groups whose prompt was seen before {spread([m['seen'] for m in metas])}; "
            f"all-equal share of the drawn groups {spread([m['equal_share'] for m in metas])}"
        )
        head = ["predictor, policy", "AUC (seen prompts)"]
        for r in rates:
            head += [f"r={r:g}: all-equal share rolled out", f"r={r:g}: kept", f"r={r:g}: effective"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in studies[0]["rows"]:
            cells = [row, spread([s["rows"][row]["auc"] for s in studies])]
            for r in rates:
                cells += [
                    spread([s["rows"][row][r][k] for s in studies])
                    for k in ("equal_rolled", "kept", "effective")
                ]
            print("| " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
