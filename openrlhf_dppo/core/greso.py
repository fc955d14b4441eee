"""GRESO's pre-rollout skip (Zheng et al. 2025), the biased peer of ``--dppo.method greso``; the rule and
its constants are docs/METHOD.md's ("The peers: CPPO and GRESO"). Kept prompts train at weight 1.
"""

from __future__ import annotations

import torch

EASY_MIN = 0.98  # an all-equal group whose mean reward is at least this is "easy" (all solved)
HARD_MAX = 0.11  # an all-equal group whose mean reward is at most this is "hard" (all failed)
KEEP_FLOOR = 0.01  # the lowest keep probability of a prompt with a streak
ALPHA = 0.25  # the target share of all-equal groups among a step's rolled-out groups
EASY_TARGET, HARD_TARGET = ALPHA / 3, 2 * ALPHA / 3
# p_easy and p_hard are held in hundredths (integers), so each 0.01 move is exact: p = k / 100
P_START, P_STEP, P_LOW, P_HIGH = 50, 1, 5, 95
_STATE_VERSION = 1


def group_kinds(group_rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """group_rewards: (n, G) raw rewards of n rolled-out groups -> (easy, hard), bool (n,) each: the G
    rewards are all equal (compared in float64) with mean >= ``EASY_MIN`` (easy) or <= ``HARD_MAX`` (hard)."""
    if group_rewards.dim() != 2:
        raise ValueError(f"group rewards of shape {tuple(group_rewards.shape)}: expected (n, G)")
    r = group_rewards.detach().to(torch.float64)
    equal = (r == r[:, :1]).all(dim=1)
    mean = r.mean(dim=1) if r.shape[1] else torch.zeros(r.shape[0], dtype=torch.float64)
    return equal & (mean >= EASY_MIN), equal & (mean <= HARD_MAX)


def greso_shares(group_rewards: torch.Tensor) -> tuple[float, float]:
    """(easy share, hard share) among the rolled-out groups (n, G); (0.0, 0.0) for n = 0."""
    easy, hard = group_kinds(group_rewards)
    n = easy.numel()
    if n == 0:
        return 0.0, 0.0
    return float(easy.sum()) / n, float(hard.sum()) / n


def greso_keep_probs(
    z_easy: torch.Tensor, z_hard: torch.Tensor, p_easy: float, p_hard: float
) -> torch.Tensor:
    """Keep probabilities (float64, like the streaks): max(p_easy ** z_easy, ``KEEP_FLOOR``) where
    z_easy > 0, else max(p_hard ** z_hard, ``KEEP_FLOOR``) where z_hard > 0, else 1."""
    ze, zh = z_easy.to(torch.float64), z_hard.to(torch.float64)
    easy = torch.clamp_min(torch.pow(torch.as_tensor(float(p_easy), dtype=torch.float64), ze), KEEP_FLOOR)
    hard = torch.clamp_min(torch.pow(torch.as_tensor(float(p_hard), dtype=torch.float64), zh), KEEP_FLOOR)
    return torch.where(ze > 0, easy, torch.where(zh > 0, hard, torch.ones_like(ze)))


class GresoStreaks:
    """Per dataset index (int >= 0; arrays grown on demand): ``z_easy``, ``z_hard`` (int64, the trailing run
    of easy / hard groups) and ``rollouts`` (int64, groups rolled out so far)."""

    def __init__(self, capacity: int = 0) -> None:
        self.z_easy = torch.zeros(int(capacity), dtype=torch.int64)
        self.z_hard = torch.zeros(int(capacity), dtype=torch.int64)
        self.rollouts = torch.zeros(int(capacity), dtype=torch.int64)

    @property
    def capacity(self) -> int:
        return self.z_easy.numel()

    def _grow(self, size: int) -> None:
        if size > self.capacity:
            extra = size - self.capacity
            for name in ("z_easy", "z_hard", "rollouts"):
                a = getattr(self, name)
                setattr(self, name, torch.cat([a, torch.zeros(extra, dtype=torch.int64)]))

    def streaks(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(z_easy, z_hard) of the prompts ``index`` (int64 (n,)); 0 for an index never rolled out."""
        index = index.to(torch.int64)
        self._grow(int(index.max()) + 1 if index.numel() else 0)
        return self.z_easy[index].clone(), self.z_hard[index].clone()

    def seen(self, index: torch.Tensor) -> torch.Tensor:
        """bool (n,): each prompt of ``index`` was rolled out at least once."""
        index = index.to(torch.int64)
        self._grow(int(index.max()) + 1 if index.numel() else 0)
        return self.rollouts[index] > 0

    def update(self, index: torch.Tensor, group_rewards: torch.Tensor) -> None:
        """One rolled-out group per row: index (n,) int64, group_rewards (n, G) raw rewards. An easy group
        adds 1 to its prompt's z_easy and zeroes z_hard, a hard one the reverse, any other zeroes both. Rows
        are applied in order (a prompt rolled out twice in one update ends with its last group's run)."""
        index = index.to(torch.int64).reshape(-1)
        if index.numel() != group_rewards.shape[0]:
            raise ValueError(f"{index.numel()} indices for {group_rewards.shape[0]} groups")
        if index.numel() and int(index.min()) < 0:
            raise ValueError("dataset indices must be >= 0")
        easy, hard = group_kinds(group_rewards)
        self._grow(int(index.max()) + 1 if index.numel() else 0)
        for k, e, h in zip(index.tolist(), easy.tolist(), hard.tolist()):
            self.z_easy[k] = self.z_easy[k] + 1 if e else 0
            self.z_hard[k] = self.z_hard[k] + 1 if h else 0
            self.rollouts[k] += 1

    def state_dict(self) -> dict:
        """Tensors and plain values only (loads with ``torch.load(weights_only=True)``)."""
        return {
            "version": _STATE_VERSION,
            "z_easy": self.z_easy.clone(),
            "z_hard": self.z_hard.clone(),
            "rollouts": self.rollouts.clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported GresoStreaks state version {state.get('version')!r}")
        arrays = {
            k: state[k].detach().cpu().to(torch.int64).clone() for k in ("z_easy", "z_hard", "rollouts")
        }
        sizes = {a.numel() for a in arrays.values()}
        if len(sizes) != 1:
            raise ValueError(f"inconsistent GresoStreaks arrays, sizes {sorted(sizes)}")
        self.z_easy, self.z_hard, self.rollouts = arrays["z_easy"], arrays["z_hard"], arrays["rollouts"]


class GresoController:
    """p_easy and p_hard (0.5 at start), moved once per step by ``update``."""

    def __init__(self) -> None:
        self._easy, self._hard = P_START, P_START  # hundredths
        self.updates = 0

    @property
    def p_easy(self) -> float:
        return self._easy / 100

    @property
    def p_hard(self) -> float:
        return self._hard / 100

    def update(self, easy_share: float, hard_share: float) -> None:
        """One step's shares (``greso_shares``): each p moves 0.01 down if its share >= its target
        (``EASY_TARGET``, ``HARD_TARGET``), 0.01 up otherwise, clamped to [0.05, 0.95]."""
        for share in (easy_share, hard_share):
            if not 0.0 <= float(share) <= 1.0:
                raise ValueError(f"a share must be in [0, 1], got {share}")

        def move(k: int, share: float, target: float) -> int:
            return min(P_HIGH, max(P_LOW, k - P_STEP if share >= target else k + P_STEP))

        self._easy = move(self._easy, float(easy_share), EASY_TARGET)
        self._hard = move(self._hard, float(hard_share), HARD_TARGET)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"version": _STATE_VERSION, "easy": self._easy, "hard": self._hard, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported GresoController state version {state.get('version')!r}")
        self._easy, self._hard, self.updates = int(state["easy"]), int(state["hard"]), int(state["updates"])
