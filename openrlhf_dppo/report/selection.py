"""Prompt-selection rules replayed on a GRPO run's prompt log: what each rule would have rolled out, and
at what generation and training cost (``openrlhf-dppo advise``).

A GRPO run made with ``--dppo.prompt_log true`` logs every drawn prompt's group each step (``prompt_log``).
Each step is replayed through every rule before the history learns the step's rewards, as a DPPO draw at
that step would have been made from the same past; nothing is trained, so every rule is judged on
GRPO's own trajectory. A group whose G rewards are all equal carries no policy gradient (group
estimator, no KL or entropy term); every other group carries some. The rules:

- ``uniform``: q = 1 - r for every prompt.
- ``history``: the project's own history (``core.PromptHistory`` at the run's ``--dppo.history_decay``,
  ``--dppo.history_prior`` and ``--dppo.reward_kind``) and keep rule (``core.prompt_keep_probs``:
  q = clip(c s, q_min, 1), expected kept share 1 - r), unseen prompts kept (``keep``: q = 1) or scored like
  an average seen one (``mean``), as ``--dppo.unseen_prompts``.
- ``zero-share``: the history (``mean``) at the rate of ``core.PromptRateControl`` (``--dppo.prompt_rate_control
  zero-share``: the smoothed all-equal share of the past steps, capped at ``--dppo.prompt_prune_rate_max``),
  fed the replayed steps' shares. One point, not a sweep.
- ``screen k`` (not built in the trainer: a study): every drawn prompt first gets k of its G completions,
  replayed as the first k logged rewards of its group. A screen that is not all equal shows a group that
  carries gradient (s = 1); one all equal at v scores s = 1 - P(the other G - k all equal v), with
  p = (prior + screen successes [+ the history's discounted successes]) / (2 prior + k [+ its discounted
  count]) (rewards read as success probabilities: a reward >= 0.5 as a success). ``alone`` uses the
  prior only, ``+ history`` the history's counts too. q = clip(c s, q_min, 1) with the other G - k of the
  group rolled out for kept prompts only; weight 1/q as any prompt draw.
- ``oracle``: s = 1 on the groups that carry gradient, 0 on the others (q_min there): the most any rule
  with the floor q_min keeps at that cost.
- the prompt policies (``--dppo.prompt_policy``, ``core.PROMPT_POLICIES``) through the trainer's own code
  (``PromptHistory.signals`` at the run's ``--algo.advantage.estimator``, ``core.prompt_policy_keep_probs``;
  the history learns each group's logged completion lengths as its cost): at zero-share's rate with unseen
  prompts scored as the mean (the recommended mode's rate control and unseen rule), ``zero-share``
  (``proportional``, the recommended mode itself), ``zero-share sqrt`` and ``zero-share uniform`` (the
  equal-cost control), and ``zero-share oracle`` (the oracle at that rate: the headroom); at each fixed
  rate, ``sqrt, unseen keep|mean``.

Every rule is also split by whether the group's prompt had been rolled out before the step (``seen``) or
not (``unseen``: its draw can know nothing of it), and set against a uniform draw at the same generation
cost: at each step the uniform draw keeps every prompt with q = that step's ``gen`` of the rule, so its
effective share over a set of groups is their count / sum over them of 1 / gen of their step.
``over uniform`` = the rule's effective share - that (> 0: the rule chooses better than chance at its
cost; the issue's goal is >= 0.10).

Per rule and rate, pooled over the steps: ``kept`` = sum of q over the gradient-carrying groups / their
count (the expected share of them rolled out), ``effective`` = their harmonic mean of q (the share of
GRPO's gradient groups a 1/q-weighted step is worth when their gradients are alike), ``gen`` and ``train``
= the generation and training cost as a share of GRPO's. Cost model: a round of generation costs its
share of GRPO's generated tokens (the logged completion lengths when prompts.jsonl has them, else every
completion alike), training the share of the tokens trained: with the exact drop of advantage-0
completions on (``Replay.zero_drop``, the run's own settings allow it) only the rolled-out groups that
carry gradient, as the trainer does (GRPO trains every group). Screening's round 1 is such a share (k/G of
every group); its round 2 is a second, sequential round, charged at least its own longest completion
against the step's longest: gen = t1 + max(t2, E[longest of round 2] / longest of the step), the
expectation over the independent keep draws. Without logged lengths round 2 is charged a whole round
(its longest may be the step's): an upper bound, and screening's figures say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch

from openrlhf_dppo import prompt_log
from openrlhf_dppo.core.history import PromptHistory
from openrlhf_dppo.core.keep_probs import prompt_keep_probs, prompt_policy_keep_probs
from openrlhf_dppo.core.rate_control import PromptRateControl

SCREEN_KS = (1, 2, 4)


@dataclass(frozen=True)
class Step:
    """One logged step: dataset indices (n,), raw rewards (n, G), completion lengths (n, G) or None."""

    index: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray | None = None

    @property
    def grad(self) -> np.ndarray:  # (n,) bool: the group's rewards are not all equal
        return self.rewards.max(axis=1) != self.rewards.min(axis=1)

    def tokens(self) -> np.ndarray:  # (n, G): the lengths, or 1 per completion when not logged
        return np.ones_like(self.rewards) if self.lengths is None else self.lengths.astype(np.float64)


def read_steps(run_dir: str | os.PathLike) -> tuple[list[Step], bool]:
    """The run's prompt log as Steps (``prompt_log.read``: the trained steps, lengths where logged) and
    whether every group was rolled out with q = 1 (a GRPO run's log: every drawn prompt's group).
    Raises RunDirError without a log."""
    rows = prompt_log.read(run_dir)
    steps = [
        Step(
            np.asarray(row["index"], dtype=np.int64),
            np.asarray(row["rewards"], dtype=np.float64),
            None if row.get(prompt_log.LENGTHS) is None else np.asarray(row[prompt_log.LENGTHS], np.float64),
        )
        for row in rows
    ]
    return steps, all(q == 1.0 for row in rows for q in row["q"])


@dataclass(frozen=True)
class Replay:
    """The history's settings (the run's ``--dppo.*``) and what to replay."""

    rates: tuple[float, ...] = (0.25, 0.5, 0.75)
    decay: float = 0.5
    prior: float = 1.0
    reward_kind: str = "auto"
    q_min: float = 0.1
    screen_ks: tuple[int, ...] = SCREEN_KS
    zero_share_initial: float = 0.5  # --dppo.prompt_prune_rate: zero-share's rate until a step is measured
    zero_share_cap: float = 0.7  # --dppo.prompt_prune_rate_max
    # the trainer's exact drop of advantage-0 completions is on (--dppo.drop_zero_advantage, no KL or entropy
    # term, a group estimator without batch whitening): a rolled-out all-equal group is generated, not trained
    zero_drop: bool = True
    estimator: str = "group_norm"  # --algo.advantage.estimator: the E[v] the sqrt rule reads


POLICY_RULES = {"zero-share": "proportional", "zero-share sqrt": "sqrt", "zero-share uniform": "uniform"}
SQRT_RULES = {"sqrt, unseen keep": "keep", "sqrt, unseen mean": "mean"}
SUBSETS = ("seen", "unseen")


@dataclass
class _Sums:
    """Sums over one set of gradient-carrying groups: sum q, sum 1/q, their count, and sum 1/gen of their
    steps (a uniform draw at the rule's cost: q = gen)."""

    q: float = 0.0
    inv_q: float = 0.0
    n: int = 0
    inv_gen: float = 0.0

    def add(self, q: np.ndarray, gen: float) -> None:
        self.q += float(q.sum())
        self.inv_q += float((1.0 / q).sum())
        self.n += int(q.size)
        self.inv_gen += q.size / min(max(gen, 1e-12), 1.0)

    def shares(self) -> tuple[float, float, float]:
        """(kept, effective, a uniform draw's effective share at equal cost); nan where no group."""
        if not self.n:
            return float("nan"), float("nan"), float("nan")
        return self.q / self.n, self.n / self.inv_q, self.n / self.inv_gen


@dataclass
class Tally:
    """Pooled sums of one (rule, rate) over the replayed steps."""

    sums: dict[str, _Sums] = field(default_factory=lambda: {k: _Sums() for k in ("all", *SUBSETS)})
    gen: list[float] = field(default_factory=list)  # per step, share of GRPO's generation
    train: list[float] = field(default_factory=list)  # per step, share of GRPO's trained tokens
    rate: list[float] = field(default_factory=list)  # the rate of each draw

    def add(
        self,
        q: np.ndarray,
        grad: np.ndarray,
        gen: float,
        train: float,
        rate: float,
        seen: np.ndarray | None = None,
    ) -> None:
        seen = np.ones_like(grad) if seen is None else seen
        self.sums["all"].add(q[grad], gen)
        self.sums["seen"].add(q[grad & seen], gen)
        self.sums["unseen"].add(q[grad & ~seen], gen)
        self.gen.append(gen)
        self.train.append(train)
        self.rate.append(rate)

    def result(self) -> dict[str, float]:
        kept, effective, uniform = self.sums["all"].shares()
        out = {
            "kept": kept,
            "effective": effective,
            "uniform": uniform,
            "gen": float(np.mean(self.gen)),
            "train": float(np.mean(self.train)),
            "rate": float(np.mean(self.rate)),
        }
        for name in SUBSETS:
            k, e, u = self.sums[name].shares()
            out |= {f"kept_{name}": k, f"effective_{name}": e, f"uniform_{name}": u}
            out[f"grad_{name}"] = float(self.sums[name].n)
        return out


def expected_longest(longest: np.ndarray, q: np.ndarray) -> float:
    """E[max of ``longest`` over the items kept], each kept independently with probability q (0 when
    none is): sum_m L_(m) q_(m) prod_{l < m} (1 - q_(l)), items sorted by L descending."""
    order = np.argsort(-longest, kind="stable")
    L, p = longest[order], q[order]
    none_before = np.concatenate([[1.0], np.cumprod(1.0 - p)[:-1]])
    return float((L * p * none_before).sum())


def screen_scores(rewards: np.ndarray, k: int, succ: np.ndarray, n: np.ndarray, prior: float) -> np.ndarray:
    """(n,) P(the group is not all equal | its first k rewards), the screen's rule of the module
    docstring; ``succ``/``n``: the discounted successes and count the posterior adds (zeros: alone)."""
    G = rewards.shape[1]
    screen = rewards[:, :k]
    mixed = screen.max(axis=1) != screen.min(axis=1)
    p = (prior + screen.sum(axis=1) + succ) / (2.0 * prior + k + n)
    p = np.clip(p, 0.0, 1.0)
    high = screen[:, 0] >= 0.5
    same = np.where(high, p, 1.0 - p) ** (G - k)  # P(the other G - k all equal the screen's value)
    return np.where(mixed, 1.0, 1.0 - same)


def _history_counts(history: PromptHistory, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The history's discounted successes and counts of these prompts (0 where never seen)."""
    succ, n = np.zeros(index.size), np.zeros(index.size)
    inside = index < history.capacity
    succ[inside], n[inside] = history.succ[index[inside]], history.n[index[inside]]
    return succ, n


def _keep(score: np.ndarray, rate: float, q_min: float, unseen: float | None = None) -> np.ndarray:
    q, _ = prompt_keep_probs(torch.from_numpy(score), 1.0 - rate, q_min, unseen_score=unseen)
    return q.numpy()


def _policy(signals, rate: float, policy: str, q_min: float) -> np.ndarray:
    """q of a registered prompt policy at prune rate ``rate``, as the trainer computes it."""
    q, _ = prompt_policy_keep_probs(signals, 1.0 - rate, policy, q_min)
    return q.numpy()


def replay(steps: list[Step], cfg: Replay) -> dict[str, dict[float, dict[str, float]]]:
    """{rule: {rate: {kept, effective, uniform, gen, train, rate, and kept_S, effective_S, uniform_S,
    grad_S for S in seen, unseen}}} over the steps (module docstring); the zero-share rules' one point is
    under the rate key 0.0 with its mean ``rate``."""
    G = steps[0].rewards.shape[1]
    hist = PromptHistory(decay=cfg.decay, prior=cfg.prior, reward_kind=cfg.reward_kind)
    control = PromptRateControl("zero-share", cfg.zero_share_initial, cfg.zero_share_cap)
    ks = [k for k in cfg.screen_ks if 0 < k < G]
    tallies: dict[tuple[str, float], Tally] = {}

    def tally(rule: str, rate: float, q: np.ndarray, step: Step, gen=None, train=None, at=None) -> None:
        tok = step.tokens()
        share = float((q * tok.sum(axis=1)).sum() / tok.sum())
        trained = float((q * step.grad * tok.sum(axis=1)).sum() / tok.sum()) if cfg.zero_drop else share
        gen, train = share if gen is None else gen, trained if train is None else train
        tallies.setdefault((rule, rate), Tally()).add(
            q, step.grad, gen, train, rate if at is None else at, seen
        )

    for number, step in enumerate(steps, 1):
        grad, tok = step.grad, step.tokens()
        index = step.index
        idx = torch.from_numpy(index)
        seen_score = hist.score(idx, G).numpy()
        seen = np.isfinite(seen_score)  # rolled out before this step
        mean_seen = hist.mean_seen_score(G)
        succ, n = _history_counts(hist, index)
        signals = {u: hist.signals(idx, G, cfg.estimator, u) for u in ("keep", "mean")}
        zero_rate = control.rate()
        for rule, policy in POLICY_RULES.items():
            tally(rule, 0.0, _policy(signals["mean"], zero_rate, policy, cfg.q_min), step, at=zero_rate)
        tally(
            "zero-share oracle", 0.0, _keep(grad.astype(np.float64), zero_rate, cfg.q_min), step, at=zero_rate
        )
        for r in cfg.rates:
            tally("uniform", r, np.full(index.size, 1.0 - r), step)
            tally("oracle", r, _keep(grad.astype(np.float64), r, cfg.q_min), step)
            tally("history, unseen keep", r, _keep(seen_score, r, cfg.q_min), step)
            tally("history, unseen mean", r, _keep(seen_score, r, cfg.q_min, mean_seen), step)
            for rule, unseen in SQRT_RULES.items():
                tally(rule, r, _policy(signals[unseen], r, "sqrt", cfg.q_min), step)
            for k in ks:
                for label, (s_, n_) in (
                    ("alone", (np.zeros_like(succ), np.zeros_like(n))),
                    ("+ history", (succ, n)),
                ):
                    q = _keep(screen_scores(step.rewards, k, s_, n_, cfg.prior), r, cfg.q_min)
                    t1 = float(tok[:, :k].sum() / tok.sum())
                    t2 = float((q * tok[:, k:].sum(axis=1)).sum() / tok.sum())
                    if step.lengths is None:
                        l2 = 1.0  # round 2 may hold the step's longest completion: a whole round
                    else:
                        l2 = expected_longest(tok[:, k:].max(axis=1), q) / float(tok.max())
                    tally(f"screen k={k} {label}", r, q, step, gen=t1 + max(t2, l2))
        lengths = None if step.lengths is None else torch.from_numpy(step.lengths)
        hist.update(idx, torch.from_numpy(step.rewards), number, tokens=lengths)
        control.observe(float(1.0 - grad.mean()))
    out: dict[str, dict[float, dict[str, float]]] = {}
    for (rule, rate), t in tallies.items():
        out.setdefault(rule, {})[rate] = t.result()
    return out


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a positive's score > a negative's), ties a half (the Mann-Whitney statistic); nan if one is empty."""
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    neg = np.sort(neg)
    below, not_above = np.searchsorted(neg, pos, "left"), np.searchsorted(neg, pos, "right")
    return float((below + 0.5 * (not_above - below)).sum() / (pos.size * neg.size))


def history_auc(steps: list[Step], cfg: Replay) -> float:
    """The history's AUC on seen prompts: P(a gradient-carrying group scored above an all-equal one)."""
    G = steps[0].rewards.shape[1]
    hist = PromptHistory(decay=cfg.decay, prior=cfg.prior, reward_kind=cfg.reward_kind)
    scores, grads = [], []
    for number, step in enumerate(steps, 1):
        scores.append(hist.score(torch.from_numpy(step.index), G).numpy())
        grads.append(step.grad)
        hist.update(torch.from_numpy(step.index), torch.from_numpy(step.rewards), number)
    s, g = np.concatenate(scores), np.concatenate(grads)
    seen = np.isfinite(s)
    return auc(s[seen & g], s[seen & ~g])
