"""The prompt prune rate of each draw (``--dppo.prompt_rate_control``; beyond the paper).

- ``fixed``: every draw prunes at ``--dppo.prompt_prune_rate`` (METHOD.md, "Level 1").
- ``zero-share`` (the default): a draw prunes at the share of the drawn prompts whose G rewards were all
  equal in the past steps, capped at ``ZERO_SHARE_CAP``; ``--dppo.prompt_prune_rate`` until a step was
  measured. Such a group has advantage 0 under a group estimator and no policy gradient (without a KL or
  entropy term), so that share is what pruning can skip at no cost to GRPO's gradient. The share is the
  Horvitz-Thompson estimate for each step's drawn batch (``rollout/equal_reward_frac_ht``,
  ``core.reward_stats``: unbiased under the step's own pruning, where the plain rolled-out share would be
  tilted towards the prompts the score keeps), smoothed over steps by an exponential moving average
  (weight ``SMOOTHING`` on the past).

Unbiasedness: the rate of a draw is a function of earlier steps' rollouts only. Given them, q of every
drawn prompt is fixed before this step's rollout, and E[mask / q] = 1 holds as with a fixed rate
(``tests/core/test_unbiased.py`` runs the controlled rate through the Monte-Carlo check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RATE_CONTROLS = ("fixed", "zero-share")
SMOOTHING = 0.8  # weight of the past in the moving average: about the last 5 steps count
ZERO_SHARE_CAP = 0.7  # the highest prune rate zero-share sets (so q_min <= 0.3 under it)
_STATE_VERSION = 1


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
        """Record a step's all-equal share (``rollout/equal_reward_frac_ht``; it may exceed 1 on a step:
        an estimate, taken as it is, as clipping it would bias the average)."""
        if self.mode == "fixed":
            return
        u = float(equal_share_ht)
        if not math.isfinite(u) or u < 0:
            raise ValueError(f"the all-equal share must be a finite number >= 0, got {equal_share_ht}")
        self.share = u if self.share is None else self.smoothing * self.share + (1.0 - self.smoothing) * u

    # -- checkpoint -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"version": _STATE_VERSION, "mode": self.mode, "share": self.share}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported PromptRateControl state version {state.get('version')!r}")
        if state["mode"] != self.mode:
            raise ValueError(
                f"the checkpoint's prompt rate control is {state['mode']!r}, this run's {self.mode!r}: "
                "resume with the same --dppo.prompt_rate_control"
            )
        self.share = None if state["share"] is None else float(state["share"])


__all__ = ["RATE_CONTROLS", "SMOOTHING", "ZERO_SHARE_CAP", "PromptRateControl"]
