"""Per-prompt history for prompt-level pruning (METHOD.md, "Level 1").

A ``PromptHistory`` holds, for every dataset index seen (arrays grown on demand, 20 bytes per prompt):

    count      int32    times the prompt was rolled out
    last_step  int32    the step of its last rollout (-1: never)
    succ       float32  discounted sum of rewards        succ <- decay * succ + sum_i r_i
    n          float32  discounted number of rewards     n    <- decay * n    + G
    var        float32  EMA of the within-group reward variance (unbiased, 0 for G = 1);
                        var <- decay * var + (1 - decay) * var_group  (the first rollout sets it)

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
"""

from __future__ import annotations

import numpy as np
import torch

REWARD_KINDS = ("auto", "binary", "continuous")
_FIELDS = {"count": np.int32, "last_step": np.int32, "succ": np.float32, "n": np.float32, "var": np.float32}
_STATE_VERSION = 1


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
    def update(self, idx, rewards: torch.Tensor, step: int) -> None:
        """Record one rollout per row.

        idx: (n,) dataset indices; rewards: (n, G) the group's rewards; step: the training step.
        A repeated index is applied in order of appearance (as n separate rollouts).
        """
        i = self._index(idx)
        r = torch.as_tensor(rewards).detach().cpu().to(torch.float64).numpy()
        if r.ndim != 2 or r.shape[0] != i.size:
            raise ValueError(f"rewards must have shape ({i.size}, G), got {tuple(r.shape)}")
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
            self._update_unique(i[sel], r[sel], int(step))

    def _update_unique(self, i: np.ndarray, r: np.ndarray, step: int) -> None:
        a, d = self._a, self.decay
        G = r.shape[1]
        var = r.var(axis=1, ddof=1) if G > 1 else np.zeros(r.shape[0])
        first = a["count"][i] == 0
        a["succ"][i] = d * a["succ"][i] + r.sum(axis=1)
        a["n"][i] = d * a["n"][i] + G
        a["var"][i] = np.where(first, var, d * a["var"][i] + (1.0 - d) * var)
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
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported PromptHistory state version {state.get('version')!r}")
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
