"""The prompt level's state across steps (docs/METHOD.md, "The prompt history" and "The prune rate"): the
per-prompt history the draw scores prompts from (``PromptHistory``) and the prune rate of each draw
(``PromptRateControl``), which depends on earlier steps only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

DECAY = 0.5  # per-rollout decay of a prompt's statistics
PRIOR = 1.0  # Beta(PRIOR, PRIOR) pseudo-count of the success estimate
_FIELDS = {"count": np.int32, "last_step": np.int32, "succ": np.float32, "n": np.float32, "var": np.float32}
_STATE_VERSION = 4  # 4: the fields above; 1-3 also held per-prompt costs, ignored on load
RATE_CONTROLS = ("fixed", "zero-share")
SMOOTHING = 0.8  # weight of the past in the moving average: about the last 5 steps count
ZERO_SHARE_CAP = 0.7  # the highest prune rate zero-share sets (so q_min <= 0.3 under it)
_RATE_STATE_VERSION = 1


class PromptSignals(NamedTuple):
    """Each field (B,). score: float64, finite >= 0 (the mean seen score for an unseen prompt);
    unseen: bool, never rolled out."""

    score: torch.Tensor
    unseen: torch.Tensor


class PromptHistory:
    """Vectorised per-prompt statistics keyed by dataset index (int64 >= 0)."""

    def __init__(self, capacity: int = 0) -> None:
        self.group_size = 0  # G of the last update (the score's default)
        self.all_binary = True  # every reward seen so far is 0 or 1
        self._a = {k: np.zeros(0, dtype=t) for k, t in _FIELDS.items()}
        self._grow(int(capacity))

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

    def update(self, idx, rewards: torch.Tensor, step: int) -> None:
        """One rollout per row: idx (n,) dataset indices, rewards (n, G), step: the training step. A
        repeated index is applied in order of appearance."""
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
        a, d = self._a, DECAY
        G = r.shape[1]
        var = r.var(axis=1, ddof=1) if G > 1 else np.zeros(r.shape[0])
        first = a["count"][i] == 0
        a["succ"][i] = d * a["succ"][i] + r.sum(axis=1)
        a["n"][i] = d * a["n"][i] + G
        a["var"][i] = np.where(first, var, d * a["var"][i] + (1.0 - d) * var)
        a["count"][i] += 1
        a["last_step"][i] = step

    def success(self, idx) -> torch.Tensor:
        """Posterior-mean success estimate p_hat (B,) float64 (0.5 for unseen prompts)."""
        i = self._index(idx)
        succ, n = self._gather(i, "succ"), self._gather(i, "n")
        return torch.from_numpy((succ + PRIOR) / (n + 2.0 * PRIOR))

    def score(self, idx, group_size: int | None = None) -> torch.Tensor:
        """Learning-signal score (B,) float64; +inf where never seen. group_size: G of the next rollout
        (default: G of the last update)."""
        i = self._index(idx)
        G = int(group_size or self.group_size or 1)
        seen = self._gather(i, "count") > 0
        if self.all_binary:
            p = self.success(i).numpy().clip(0.0, 1.0)
            s = 1.0 - p**G - (1.0 - p) ** G
        else:
            s = np.sqrt(np.maximum(self._gather(i, "var"), 0.0))
        return torch.from_numpy(np.where(seen, s, np.inf))

    def mean_seen_score(self, group_size: int | None = None) -> float:
        """The mean ``score`` over every prompt rolled out so far (1.0 before any)."""
        seen = np.flatnonzero(self._a["count"] > 0)
        if seen.size == 0:
            return 1.0
        return float(self.score(seen, group_size).mean())

    def signals(self, idx, group_size: int | None = None) -> PromptSignals:
        """The scores the draw reads, an unseen prompt's the mean seen score. Depends on the history only."""
        score = self.score(self._index(idx), group_size)
        new = torch.isinf(score)
        return PromptSignals(torch.where(new, self.mean_seen_score(group_size), score), new)

    def _gather(self, i: np.ndarray, field: str) -> np.ndarray:
        a = self._a[field]
        out = np.zeros(i.size, dtype=np.float64)
        inside = i < a.shape[0]
        out[inside] = a[i[inside]]
        return out

    def state_dict(self) -> dict:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        state: dict[str, object] = {k: torch.from_numpy(a.copy()) for k, a in self._a.items()}
        state.update(version=_STATE_VERSION, group_size=self.group_size, all_binary=self.all_binary)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Loads versions 1-4; refuses a state made with another decay, prior or reward kind."""
        if state.get("version") not in (1, 2, 3, _STATE_VERSION):
            raise ValueError(f"unsupported PromptHistory state version {state.get('version')!r}")
        made = (state.get("decay", DECAY), state.get("prior", PRIOR), state.get("reward_kind", "auto"))
        if made != (DECAY, PRIOR, "auto"):
            raise ValueError(
                f"the PromptHistory state was made with decay, prior, reward kind {made}; this version uses "
                f"{(DECAY, PRIOR, 'auto')}"
            )
        self.group_size = int(state["group_size"])
        self.all_binary = bool(state["all_binary"])
        self._a = {k: state[k].detach().cpu().numpy().astype(t, copy=True) for k, t in _FIELDS.items()}
        sizes = {a.shape[0] for a in self._a.values()}
        if len(sizes) != 1:
            raise ValueError(f"inconsistent PromptHistory arrays, sizes {sorted(sizes)}")


@dataclass
class PromptRateControl:
    """The rate rule and its state. ``initial``: ``--dppo.prompt_prune_rate``; ``cap``: the highest rate
    zero-share sets."""

    mode: str = "fixed"
    initial: float = 0.0
    cap: float = ZERO_SHARE_CAP
    smoothing: float = SMOOTHING
    share: float | None = None  # smoothed all-equal share (None: no step measured yet)

    def __post_init__(self) -> None:
        if self.mode not in RATE_CONTROLS:
            raise ValueError(f"unknown prompt rate control {self.mode!r}; valid: {', '.join(RATE_CONTROLS)}")
        for name in ("initial", "cap"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"{name} must be a prune rate in [0, 1), got {v}")
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing}")

    @classmethod
    def from_config(cls, cfg) -> PromptRateControl:
        """From a ``DPPOConfig`` (its fields are validated there)."""
        return cls(mode=cfg.prompt_rate_control, initial=cfg.prompt_prune_rate)

    def rate(self) -> float:
        """The prune rate r_q of the next draw."""
        if self.mode == "fixed" or self.share is None:
            return self.initial
        return min(self.share, self.cap)  # observe keeps it >= 0

    def observe(self, equal_share_ht: float) -> None:
        """Record a step's ``rollout/equal_reward_frac_ht`` (unclipped: it may exceed 1)."""
        if self.mode == "fixed":
            return
        u = float(equal_share_ht)
        if not math.isfinite(u) or u < 0:
            raise ValueError(f"the all-equal share must be a finite number >= 0, got {equal_share_ht}")
        self.share = u if self.share is None else self.smoothing * self.share + (1.0 - self.smoothing) * u

    def state_dict(self) -> dict:
        return {"version": _RATE_STATE_VERSION, "mode": self.mode, "share": self.share}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _RATE_STATE_VERSION:
            raise ValueError(f"unsupported PromptRateControl state version {state.get('version')!r}")
        if state["mode"] != self.mode:
            raise ValueError(
                f"the checkpoint's prompt rate control is {state['mode']!r}, this run's {self.mode!r}: "
                "resume with the same --dppo.prompt_rate_control"
            )
        self.share = None if state["share"] is None else float(state["share"])
