"""Monte-Carlo harness shared by ``test_unbiased.py`` and ``benchmarks/core_unbiased.py`` (not a test
file): a toy GRPO step on a softmax policy where every gradient is known in closed form.

B prompts, G completions each; completion i of prompt j is one token y ~ pi_j = softmax(theta + b_j)
over K tokens; reward 1 if y is the prompt's correct token, else 0. The per-completion loss is
l_ji = -A_ji * log pi_j(y_ji) + beta * kappa_ji with kappa_ji = -log pi_j(y_ji) (a stand-in for a
KL / entropy term: it has no A), so  grad_theta l_ji = -(A_ji + beta) * (e_y - pi_j).

Each replicate draws fresh rollouts, computes the full-batch gradient g (normaliser B * G) and, on the
same rollouts, the pruned-and-reweighted estimate g_hat through the public core API, all replicates at
once ((R, ...) tensors; the keep-probability solve and the draws are row-wise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openrlhf_dppo.core import (
    PromptHistory,
    PromptSignals,
    completion_keep_probs,
    group_advantages,
    prompt_keep_probs,
    sample_mask,
)


@dataclass
class Toy:
    B: int = 6
    G: int = 4
    K: int = 3
    beta: float = 0.0
    seed: int = 0
    unseen: bool = True  # prompt 0 never seen by ``history()`` (it takes the mean seen score)
    estimator: str = "group_norm"  # core.group_advantages' estimator of the groups

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        self.theta = torch.randn(self.K, generator=g, dtype=torch.float64) * 0.5
        self.offsets = torch.randn(self.B, self.K, generator=g, dtype=torch.float64)
        self.correct = torch.randint(0, self.K, (self.B,), generator=g)
        self.pi = torch.softmax(self.theta + self.offsets, dim=-1)  # (B, K)
        succ = self.pi[torch.arange(self.B), self.correct]
        self.scores = 1 - succ**self.G - (1 - succ) ** self.G  # the binary score at the true success rate

    def rollouts(self, R: int, gen: torch.Generator, with_rewards: bool = False):
        """-> advantages adv (R, B, G), per-completion gradients of l grads (R, B, G, K) [, the 0/1 rewards
        (R, B, G) with ``with_rewards``]."""
        u = torch.rand(R, self.B, self.G, 1, generator=gen, dtype=torch.float64)
        y = (u > self.pi.cumsum(-1)[None, :, None, :]).sum(-1).clamp_max(self.K - 1)
        rewards = (y == self.correct[None, :, None]).double()
        adv = group_advantages(rewards.reshape(R * self.B, self.G), self.estimator).reshape(R, self.B, self.G)
        onehot = torch.nn.functional.one_hot(y, self.K).double()
        grads = -(adv + self.beta)[..., None] * (onehot - self.pi[None, :, None, :])
        return (adv, grads, rewards) if with_rewards else (adv, grads)

    def past_rollouts(self, rounds: int, seed: int) -> torch.Tensor:
        """Earlier steps' groups of every prompt: rewards (rounds, B, G)."""
        gen = torch.Generator().manual_seed(seed)
        u = torch.rand(rounds, self.B, self.G, 1, generator=gen, dtype=torch.float64)
        y = (u > self.pi.cumsum(-1)[None, :, None, :]).sum(-1).clamp_max(self.K - 1)
        return (y == self.correct[None, :, None]).double()

    def history(self, rounds: int = 2, seed: int = 5, copies: int = 1) -> PromptHistory:
        """A PromptHistory that saw ``rounds`` earlier groups of every prompt but the unseen one (prompt 0
        when ``unseen``); ``copies`` > 1: the same past under indices r * B + j for r < copies (one
        independent history per replicate, in one array)."""
        rewards = self.past_rollouts(rounds, seed)
        first = 1 if self.unseen else 0
        h = PromptHistory(copies * self.B)
        idx = (torch.arange(copies)[:, None] * self.B + torch.arange(first, self.B)[None]).reshape(-1)
        for k in range(rounds):
            h.update(idx, rewards[k, first:].repeat(copies, 1), k)
        return h

    def signals(self) -> PromptSignals:
        """What the toy's history (``history()``) tells the prompt draw about the B prompts."""
        return self.history().signals(torch.arange(self.B), self.G)


@dataclass
class Result:
    diff_mean: torch.Tensor  # (K,) mean of g_hat - g over replicates
    diff_se: torch.Tensor  # (K,) its standard error
    z: torch.Tensor  # (K,) diff_mean / diff_se
    z_kept_count: torch.Tensor  # (K,) the same for the kept-count normalised control
    var_ratio: float  # trace Var(g_hat) / trace Var(g)
    keep_frac: float  # realised fraction of completions trained (of all B * G)


def simulate(
    toy: Toy,
    R: int,
    level: str,
    rate: float,
    floor: float = 0.05,
    allow_zero: bool = True,
    multiple_of: int = 1,
    seed: int = 0,
    prompt_policy: str = "proportional",
    scores: torch.Tensor | None = None,
) -> Result:
    """level: "both", "prompt" or "completion"; rate: the pruning rate of each active level (systematic
    draws); prompt_policy: a name in ``PROMPT_POLICIES``, reading ``scores`` (default: the toy's true
    scores)."""
    gen = torch.Generator().manual_seed(seed)
    B, G = toy.B, toy.G
    adv, grads = toy.rollouts(R, gen)
    full = grads.sum(dim=(1, 2)) / (B * G)  # (R, K)
    keep = 1.0 - rate
    if level in ("both", "prompt"):
        q, _ = prompt_keep_probs(toy.scores if scores is None else scores, keep, floor, prompt_policy)
        pmask, q_used = sample_mask(q.expand(R, B).contiguous(), gen)
        pw = torch.where(pmask, 1.0 / q_used, 0.0)
    else:
        pmask, pw = torch.ones(R, B, dtype=torch.bool), torch.ones(R, B, dtype=torch.float64)
    valid = pmask[:, :, None].expand(R, B, G).reshape(R, B * G)
    if level in ("both", "completion"):
        p, _ = completion_keep_probs(adv.reshape(R, B * G), keep, floor, allow_zero, valid=valid)
        cmask, p_used = sample_mask(p, gen, multiple_of=multiple_of)
        cmask &= valid
        cw = torch.where(cmask, 1.0 / torch.where(cmask, p_used, 1.0), 0.0)
    else:
        cmask, cw = valid, valid.double()
    w = (pw[:, :, None] * cw.reshape(R, B, G)).reshape(R, B * G)
    flat = grads.reshape(R, B * G, toy.K)
    est = torch.einsum("rn,rnk->rk", w, flat) / (B * G)
    n_kept = cmask.sum(dim=1, keepdim=True).clamp_min(1)
    kept_count = torch.einsum("rn,rnk->rk", w, flat) / n_kept  # the wrong normaliser
    d = est - full
    se = d.std(dim=0) / R**0.5
    d_bad = kept_count - full
    z_bad = d_bad.mean(0) / (d_bad.std(dim=0) / R**0.5)
    var_ratio = float(est.var(dim=0).sum() / full.var(dim=0).sum())
    return Result(d.mean(0), se, d.mean(0) / se, z_bad, var_ratio, float(cmask.double().mean()))


@dataclass
class WhitenedResult:
    z: torch.Tensor  # (K,) z of g_hat - g, g_hat at the full batch's (m, s): the exact part
    z_kept_count: torch.Tensor  # (K,) the same with the kept count as normaliser (the control)
    mean_err: torch.Tensor  # (R,) m_hat - m, m_hat the Horvitz-Thompson token mean of the kept
    rstd_err: torch.Tensor  # (R,) 1/s_hat - 1/s
    mean_err_unweighted: torch.Tensor  # (R,) the kept tokens' plain mean - m (the control)
    grad_err: torch.Tensor  # (R, K) g_hat - g with (m_hat, s_hat) estimated: the ratio estimator


def simulate_whitened(toy: Toy, R: int, rate: float, seed: int = 0, tile: int = 1) -> WhitenedResult:
    """REINFORCE++-baseline on the toy, both levels pruned at ``rate`` (systematic draws, floors 0.05). Completion i of prompt j has n_ji = 1 + y_ji tokens, each with the
    return c_ji (the group-centred reward; no KL) and the toy's log-prob gradient, so
    grad l_ji = -n_ji (c_ji - m) / s (e_y - pi_j), with m, s the batch's token mean and std
    (``core.token_whitening``). ``tile``: the batch is the toy's B prompts repeated ``tile`` times."""
    from openrlhf_dppo.core import token_whitening

    gen = torch.Generator().manual_seed(seed)
    B, G, K = toy.B * tile, toy.G, toy.K
    pi, correct = toy.pi.repeat(tile, 1), toy.correct.repeat(tile)
    scores = toy.scores.repeat(tile)
    u = torch.rand(R, B, G, 1, generator=gen, dtype=torch.float64)
    y = (u > pi.cumsum(-1)[None, :, None, :]).sum(-1).clamp_max(K - 1)
    rewards = (y == correct[None, :, None]).double()
    c = group_advantages(rewards.reshape(R * B, G), "reinforce_baseline").reshape(R, B * G)
    n = (1 + y).double().reshape(R, B * G)
    dirs = (torch.nn.functional.one_hot(y, K).double() - pi[None, :, None, :]).reshape(R, B * G, K)
    q, _ = prompt_keep_probs(scores, 1.0 - rate, q_min=0.05)
    pmask, q_used = sample_mask(q.expand(R, B).contiguous(), gen)
    valid = pmask[:, :, None].expand(R, B, G).reshape(R, B * G)
    p, _ = completion_keep_probs(c, 1.0 - rate, 0.05, False, valid=valid)
    cmask, p_used = sample_mask(p, gen)
    cmask &= valid
    pw = torch.where(pmask, 1.0 / q_used, 0.0)[:, :, None].expand(R, B, G).reshape(R, B * G)
    w = torch.where(cmask, pw / torch.where(cmask, p_used, 1.0), 0.0)  # (R, B*G): 1/(q p) or 0

    def stats(weight_row, r):  # token stats of replicate r with per-completion weights
        tok_w = weight_row.repeat_interleave(n[r].long())
        return token_whitening(c[r].repeat_interleave(n[r].long()), tok_w)

    Z = B * G
    full, oracle, est, kept_count = (torch.empty(R, K, dtype=torch.float64) for _ in range(4))
    mean_err, rstd_err, plain_err = (torch.empty(R, dtype=torch.float64) for _ in range(3))
    for r in range(R):
        m, rs = stats(torch.ones(B * G, dtype=torch.float64), r)
        m_hat, rs_hat = stats(w[r], r)
        m_plain, _ = stats(cmask[r].double(), r)
        per = -(n[r] * c[r])[:, None] * dirs[r]  # (B*G, K): the gradient's part in c
        base = -n[r][:, None] * dirs[r]  # the part multiplied by -m
        g_full = (per - m * base) * rs
        full[r] = g_full.sum(0) / Z
        oracle[r] = (w[r][:, None] * g_full).sum(0) / Z
        kept_count[r] = (w[r][:, None] * g_full).sum(0) / max(int(cmask[r].sum()), 1)
        est[r] = (w[r][:, None] * (per - m_hat * base) * rs_hat).sum(0) / Z
        mean_err[r], rstd_err[r], plain_err[r] = m_hat - m, rs_hat - rs, m_plain - m

    def z(d):
        return d.mean(0) / (d.std(dim=0) / R**0.5)

    return WhitenedResult(z(oracle - full), z(kept_count - full), mean_err, rstd_err, plain_err, est - full)
