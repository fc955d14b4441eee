"""Per-prompt history for prompt-level pruning (METHOD.md, "Level 1").

A ``PromptHistory`` holds, for every dataset index seen (arrays grown on demand, 28 bytes per prompt):

    count      int32    times the prompt was rolled out
    last_step  int32    the step of its last rollout (-1: never)
    succ       float32  discounted sum of rewards        succ <- decay * succ + sum_i r_i
    n          float32  discounted number of rewards     n    <- decay * n    + G
    var        float32  EMA of the within-group reward variance (unbiased, 0 for G = 1);
                        var <- decay * var + (1 - decay) * var_group  (the first rollout sets it)
    tokens     float32  discounted mean response tokens of the prompt's groups (its generation cost),
                        the same update as var; 0: no length recorded (``update`` without ``tokens``)
    mixed      float32  discounted number of its groups whose rewards were not all equal
                        mixed <- decay * mixed + [max r_i != min r_i]  (n / G: its discounted groups)

``succ / n`` is the discounted mean reward (the success rate for 0/1 rewards). The success estimate is
the mean of the discounted Beta posterior under a Beta(prior, prior) prior,
p_hat = (succ + prior) / (n + 2 * prior), never exactly 0 or 1. The decay applies per rollout of the
prompt, not per training step (a prompt is usually seen once per epoch).

The score (METHOD.md):
- binary rewards: s = 1 - p_hat^G - (1 - p_hat)^G, the probability that G samples are not all equal;
- continuous rewards: s = sqrt(var), the estimated reward std;
- never seen: s = +inf, which ``prompt_keep_probs`` turns into q = 1 (always kept).
``reward_kind="auto"`` treats rewards as binary as long as every reward seen is exactly 0 or 1.
``last_step`` is stored (and checkpointed) but not used by the score.

What the prompt policies (``core/prompt_policies``) read, ``signals`` (``PromptSignals``):
- ``moment``: E[v], the posterior mean of the group's gradient second moment (METHOD.md, "Choosing q").
  a = succ + prior, b = n - succ + prior (the discounted Beta posterior of the success rate p):
  group_norm, binary rewards: P(G samples not all equal) (a mixed group's squared advantages sum to
    about G whatever p), E = 1 - prod_{i<G} (a+i)/(a+b+i) - prod_{i<G} (b+i)/(a+b+i)
    (E[p^G] = prod_{i<G} (a+i)/(a+b+i) under Beta(a, b));
  any other estimator (dr_grpo, rloo, reinforce_baseline), binary rewards: E[p (1 - p)] =
    a b / ((a+b)(a+b+1)) (the squared centred rewards sum to about (G - 1) p (1 - p));
  group_norm, continuous rewards: P(the group's rewards are not all equal), the mean of the discounted
    Beta(mixed + prior, n / G - mixed + prior) posterior of that event (std normalisation gives a mixed
    group squared advantages summing to about G however small its spread: partial credit, e.g. 0 against
    0.05, carries as much as a solve; the reward variance would score it near 0);
  any other estimator, continuous rewards: the estimated reward variance ``var``.
- ``cost``: the expected generation cost, ``tokens``; a prompt without one takes the mean over the prompts
  that have one (1 when none has: every cost alike).
- a prompt never seen: with ``unseen="keep"`` pinned at q = 1; with ``"mean"`` it takes the mean over every
  prompt seen so far of the score, and of E[v] / c (its E[v] is that mean times its cost).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

REWARD_KINDS = ("auto", "binary", "continuous")
UNSEEN_RULES = ("keep", "mean")
_FIELDS = {
    "count": np.int32,
    "last_step": np.int32,
    "succ": np.float32,
    "n": np.float32,
    "var": np.float32,
    "tokens": np.float32,
    "mixed": np.float32,
}
_STATE_VERSION = 3  # 2: + tokens (a version-1 state loads with no length recorded); 3: + mixed


def beta_moment(a: np.ndarray, b: np.ndarray, group_size: int, estimator: str = "group_norm") -> np.ndarray:
    """E[v] for binary rewards under a Beta(a, b) posterior of the success rate (module docstring):
    group_norm: 1 - prod_{i<G} (a+i)/(a+b+i) - prod_{i<G} (b+i)/(a+b+i); any other estimator:
    a b / ((a+b)(a+b+1)). a, b > 0, arrays of one shape; float64 of that shape."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if estimator != "group_norm":
        return a * b / ((a + b) * (a + b + 1.0))
    k = np.arange(int(group_size), dtype=np.float64).reshape((-1,) + (1,) * a.ndim)  # the factors i < G
    v = 1.0 - np.prod((a + k) / (a + b + k), axis=0) - np.prod((b + k) / (a + b + k), axis=0)
    return np.maximum(v, 0.0)


class PromptSignals(NamedTuple):
    """What a prompt policy knows of each drawn prompt before its rollout; each field (B,) or (R, B).

    score:  float64 >= 0, the history's score s (METHOD.md "Level 1"; the proportional rule's input)
    moment: float64 >= 0, E[v] the posterior mean of the group's gradient second moment
    cost:   float64 > 0, the expected generation cost c (mean response tokens)
    unseen: bool, never rolled out (reported as ``dppo/prompt_unseen_frac``)
    pinned: bool, kept with q = 1 whatever the policy (unseen prompts under ``--dppo.unseen_prompts keep``);
      a pinned prompt's score and moment are 0 and unused
    """

    score: torch.Tensor
    moment: torch.Tensor
    cost: torch.Tensor
    unseen: torch.Tensor
    pinned: torch.Tensor

    @classmethod
    def of_scores(cls, scores: torch.Tensor, unseen_score: float | None = None) -> PromptSignals:
        """Signals from scores alone (``prompt_keep_probs``' input: +inf = unseen): E[v] = s, every cost
        1; unseen prompts pinned (``unseen_score`` None) or scored ``unseen_score``."""
        s = torch.as_tensor(scores).to(torch.float64)
        if torch.isnan(s).any() or (s < 0).any():
            raise ValueError("prompt scores must be >= 0 (or +inf for an unseen prompt), no NaN")
        if unseen_score is not None and not (math.isfinite(unseen_score) and unseen_score >= 0):
            raise ValueError(f"unseen_score must be a finite score >= 0 (or None), got {unseen_score}")
        unseen = torch.isinf(s)
        pinned = unseen if unseen_score is None else torch.zeros_like(unseen)
        fill = 0.0 if unseen_score is None else float(unseen_score)
        s = torch.where(unseen, fill, s)
        return cls(s, s.clone(), torch.ones_like(s), unseen, pinned)


class PromptHistory:
    """Vectorised per-prompt statistics keyed by dataset index (int64 >= 0)."""

    def __init__(
        self, capacity: int = 0, decay: float = 0.5, prior: float = 1.0, reward_kind: str = "auto"
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        if not prior > 0:
            raise ValueError(f"prior must be > 0, got {prior}")
        if reward_kind not in REWARD_KINDS:
            raise ValueError(f"unknown reward_kind {reward_kind!r}; valid: {', '.join(REWARD_KINDS)}")
        self.decay = float(decay)
        self.prior = float(prior)
        self.reward_kind = reward_kind
        self.group_size = 0  # G of the last update (the score's default)
        self.all_binary = True  # every reward seen so far is 0 or 1
        self._a = {k: np.zeros(0, dtype=t) for k, t in _FIELDS.items()}
        self._grow(int(capacity))

    # -- storage ----------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return int(self._a["count"].shape[0])

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self._a.values()))

    def _grow(self, need: int) -> None:
        old = self.capacity
        if need <= old:
            return
        new = max(need, 2 * old)
        for k, a in self._a.items():
            b = np.zeros(new, dtype=a.dtype)
            if k == "last_step":
                b[:] = -1
            b[:old] = a
            self._a[k] = b

    def __getattr__(self, name: str) -> np.ndarray:
        # read-only views of the arrays: history.count, history.succ, ...
        if name in _FIELDS and "_a" in self.__dict__:
            view = self.__dict__["_a"][name][:]
            view.flags.writeable = False
            return view
        raise AttributeError(name)

    @staticmethod
    def _index(idx) -> np.ndarray:
        i = torch.as_tensor(idx).detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)
        if i.size and i.min() < 0:
            raise ValueError("prompt indices must be >= 0")
        return i

    # -- update -----------------------------------------------------------------------------------
    def update(self, idx, rewards: torch.Tensor, step: int, tokens=None) -> None:
        """Record one rollout per row.

        idx: (n,) dataset indices; rewards: (n, G) the group's rewards; step: the training step;
        tokens: optional (n, G) response token counts of the completions (the prompt's cost).
        A repeated index is applied in order of appearance (as n separate rollouts).
        """
        i = self._index(idx)
        r = torch.as_tensor(rewards).detach().cpu().to(torch.float64).numpy()
        if r.ndim != 2 or r.shape[0] != i.size:
            raise ValueError(f"rewards must have shape ({i.size}, G), got {tuple(r.shape)}")
        tok = None if tokens is None else torch.as_tensor(tokens).detach().cpu().to(torch.float64).numpy()
        if tok is not None and tok.shape != r.shape:
            raise ValueError(f"tokens must have the shape of rewards {r.shape}, got {tuple(tok.shape)}")
        if tok is not None and not (np.isfinite(tok).all() and (tok >= 0).all()):
            raise ValueError("tokens must be finite counts >= 0")
        if i.size == 0:
            return
        if not np.isfinite(r).all():
            raise ValueError("rewards must be finite")
        self._grow(int(i.max()) + 1)
        self.group_size = int(r.shape[1])
        self.all_binary = self.all_binary and bool(np.isin(r, (0.0, 1.0)).all())
        # occurrence number of each index within this call; rows with the same number are unique
        order = np.argsort(i, kind="stable")
        si = i[order]
        starts = np.r_[0, np.flatnonzero(si[1:] != si[:-1]) + 1]
        run_start = np.repeat(starts, np.diff(np.r_[starts, si.size]))
        occ = np.empty_like(i)
        occ[order] = np.arange(si.size) - run_start
        for k in range(int(occ.max()) + 1):
            sel = occ == k
            self._update_unique(i[sel], r[sel], int(step), None if tok is None else tok[sel])

    def _update_unique(self, i: np.ndarray, r: np.ndarray, step: int, tok: np.ndarray | None) -> None:
        a, d = self._a, self.decay
        G = r.shape[1]
        var = r.var(axis=1, ddof=1) if G > 1 else np.zeros(r.shape[0])
        first = a["count"][i] == 0
        a["succ"][i] = d * a["succ"][i] + r.sum(axis=1)
        a["n"][i] = d * a["n"][i] + G
        a["var"][i] = np.where(first, var, d * a["var"][i] + (1.0 - d) * var)
        a["mixed"][i] = d * a["mixed"][i] + (r.max(axis=1) != r.min(axis=1))
        if tok is not None:  # the first length recorded sets the mean
            mean, old = tok.mean(axis=1), a["tokens"][i]
            a["tokens"][i] = np.where(old == 0, mean, d * old + (1.0 - d) * mean)
        a["count"][i] += 1
        a["last_step"][i] = step

    # -- score ------------------------------------------------------------------------------------
    def is_binary(self) -> bool:
        return self.reward_kind == "binary" or (self.reward_kind == "auto" and self.all_binary)

    def success(self, idx) -> torch.Tensor:
        """Posterior-mean success estimate p_hat (B,) float64 (prior 0.5 for unseen prompts)."""
        i = self._index(idx)
        succ, n = self._gather(i, "succ"), self._gather(i, "n")
        return torch.from_numpy((succ + self.prior) / (n + 2.0 * self.prior))

    def score(self, idx, group_size: int | None = None) -> torch.Tensor:
        """Learning-signal score (B,) float64 for the given dataset indices; +inf where never seen.

        group_size: G of the next rollout (default: G of the last update).
        """
        i = self._index(idx)
        G = int(group_size or self.group_size or 1)
        seen = self._gather(i, "count") > 0
        if self.is_binary():
            p = self.success(i).numpy().clip(0.0, 1.0)
            s = 1.0 - p**G - (1.0 - p) ** G
        else:
            s = np.sqrt(np.maximum(self._gather(i, "var"), 0.0))
        return torch.from_numpy(np.where(seen, s, np.inf))

    def mean_seen_score(self, group_size: int | None = None) -> float:
        """The mean ``score`` over every prompt rolled out so far (1.0 before any): the score an unseen
        prompt takes under ``--dppo.unseen_prompts mean``. It depends on the history only, so a draw
        that uses it is still fixed before the step's rollout."""
        seen = np.flatnonzero(self._a["count"] > 0)
        if seen.size == 0:
            return 1.0
        return float(self.score(seen, group_size).mean())

    def moment(self, idx, group_size: int | None = None, estimator: str = "group_norm") -> torch.Tensor:
        """E[v] (B,) float64, the posterior mean of the group's gradient second moment (module
        docstring); +inf where never seen. estimator: the advantage estimator of the run."""
        i = self._index(idx)
        G = int(group_size or self.group_size or 1)
        seen = self._gather(i, "count") > 0
        if self.is_binary():
            succ, n = self._gather(i, "succ"), self._gather(i, "n")
            a = np.maximum(succ, 0.0) + self.prior
            b = np.maximum(n - succ, 0.0) + self.prior
            v = beta_moment(a, b, G, estimator)
        elif estimator == "group_norm":
            mixed, groups = self._gather(i, "mixed"), self._gather(i, "n") / max(self.group_size, 1)
            v = (mixed + self.prior) / (groups + 2.0 * self.prior)
        else:
            v = np.maximum(self._gather(i, "var"), 0.0)
        return torch.from_numpy(np.where(seen, v, np.inf))

    def mean_cost(self) -> float:
        """The mean recorded cost (response tokens) over the prompts that have one; 1.0 when none has."""
        known = self._a["tokens"][self._a["tokens"] > 0]
        return float(known.astype(np.float64).mean()) if known.size else 1.0

    def cost(self, idx) -> torch.Tensor:
        """The expected generation cost c (B,) float64 > 0: the prompt's discounted mean response tokens,
        ``mean_cost()`` where no length was recorded (never seen, or updated without ``tokens``)."""
        c = self._gather(self._index(idx), "tokens")
        return torch.from_numpy(np.where(c > 0, c, self.mean_cost()))

    def signals(
        self, idx, group_size: int | None = None, estimator: str = "group_norm", unseen: str = "keep"
    ) -> PromptSignals:
        """What the prompt policies read for the given prompts (module docstring). unseen: "keep" (pinned,
        q = 1) or "mean" (the mean over every seen prompt of the score and of E[v] / c). Depends on the
        history only, so a draw made from it is fixed before the step's rollout."""
        if unseen not in UNSEEN_RULES:
            raise ValueError(f"unknown unseen rule {unseen!r}; valid: {', '.join(UNSEEN_RULES)}")
        i = self._index(idx)
        score, moment, cost = self.score(i, group_size), self.moment(i, group_size, estimator), self.cost(i)
        new = torch.isinf(score)
        if unseen == "keep":
            return PromptSignals(
                torch.where(new, 0.0, score), torch.where(new, 0.0, moment), cost, new, new.clone()
            )
        seen = np.flatnonzero(self._a["count"] > 0)
        ratio = 1.0
        if seen.size:
            ratio = float((self.moment(seen, group_size, estimator) / self.cost(seen)).mean())
        score = torch.where(new, self.mean_seen_score(group_size), score)
        moment = torch.where(new, ratio * cost, moment)
        return PromptSignals(score, moment, cost, new, torch.zeros_like(new))

    def _gather(self, i: np.ndarray, field: str) -> np.ndarray:
        a = self._a[field]
        out = np.zeros(i.size, dtype=np.float64)
        inside = i < a.shape[0]
        out[inside] = a[i[inside]]
        return out

    # -- checkpoint -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        state: dict[str, object] = {k: torch.from_numpy(a.copy()) for k, a in self._a.items()}
        state.update(
            version=_STATE_VERSION,
            decay=self.decay,
            prior=self.prior,
            reward_kind=self.reward_kind,
            group_size=self.group_size,
            all_binary=self.all_binary,
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        """Loads this version's state and the earlier ones: version 1 (before ``tokens``) with no length
        recorded; versions 1 and 2 (before ``mixed``) with every group of a prompt counted as mixed where
        its reward variance is positive, none where it is 0 (what they recorded allows no more)."""
        if state.get("version") not in (1, 2, _STATE_VERSION):
            raise ValueError(f"unsupported PromptHistory state version {state.get('version')!r}")
        if state["version"] == 1:
            state = {**state, "tokens": torch.zeros_like(state["count"], dtype=torch.float32)}
        if state["version"] in (1, 2):
            groups = state["n"].to(torch.float32) / max(int(state["group_size"]), 1)
            state = {**state, "mixed": torch.where(state["var"] > 0, groups, torch.zeros_like(groups))}
        if state["reward_kind"] not in REWARD_KINDS:
            raise ValueError(f"unknown reward_kind {state['reward_kind']!r}")
        self.decay, self.prior = float(state["decay"]), float(state["prior"])
        self.reward_kind = state["reward_kind"]
        self.group_size = int(state["group_size"])
        self.all_binary = bool(state["all_binary"])
        self._a = {k: state[k].detach().cpu().numpy().astype(t, copy=True) for k, t in _FIELDS.items()}
        sizes = {a.shape[0] for a in self._a.values()}
        if len(sizes) != 1:
            raise ValueError(f"inconsistent PromptHistory arrays, sizes {sorted(sizes)}")
