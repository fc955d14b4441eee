"""One call per pruning level for the adapters: keep probabilities -> draw -> weights -> metrics, so
that the weights always use the probabilities actually drawn with (``sample_mask``'s p_used).

``prune_prompts``     before rollout, from what the history knows of the prompts (``PromptHistory.signals``,
                      or its scores alone) under a prompt policy of ``PROMPT_POLICIES``.
``prune_completions`` after reward, from the full-group advantages of the rolled-out prompts.
Both are thin compositions of ``keep_probs``, ``sampling`` and ``weights``; nothing here is new math.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from openrlhf_dppo.core.history import PromptSignals
from openrlhf_dppo.core.keep_probs import completion_keep_probs, prompt_policy_keep_probs
from openrlhf_dppo.core.metrics import keep_metrics
from openrlhf_dppo.core.sampling import (
    FIXED_SIZE_DESIGNS,
    FIXED_SIZE_FALLBACK,
    FIXED_SIZE_NOT_MULTIPLE,
    fixed_size_probs,
    sample_mask,
)
from openrlhf_dppo.core.weights import inverse_prob_weights, weight_metrics
from openrlhf_dppo.metric_keys import (
    COMPLETION_FIXED_SIZE_FALLBACK,
    COMPLETION_FIXED_SIZE_NOT_MULTIPLE,
    COMPLETION_KEEP_FRAC_EXPECTED,
    PROMPT_FIXED_SIZE_FALLBACK,
    PROMPT_FIXED_SIZE_NOT_MULTIPLE,
    PROMPT_KEEP_FRAC_EXPECTED,
)

#: level -> (the key of the fixed-size fallback rate, the key of the not-a-multiple rate)
_FIXED_SIZE_KEYS = {
    "prompt": (PROMPT_FIXED_SIZE_FALLBACK, PROMPT_FIXED_SIZE_NOT_MULTIPLE),
    "completion": (COMPLETION_FIXED_SIZE_FALLBACK, COMPLETION_FIXED_SIZE_NOT_MULTIPLE),
}


class Draw(NamedTuple):
    """mask: (N,) bool kept; prob: (N,) float64 the inclusion probabilities used (after any
    fixed-size rescale); weight: (N,) float64, 1 / prob on kept items (times the prompt weight for
    completions when given), 0 elsewhere."""

    mask: torch.Tensor
    prob: torch.Tensor
    weight: torch.Tensor


def _draw(p: torch.Tensor, design: str, generator, multiple_of: int, level: str, nonempty: bool = False):
    """(mask, p_used, metrics): the fixed-size rescale (reported) then the draw. ``sample_mask`` leaves
    a row whose sum is already an integer unchanged, so p_used is the rescaled p exactly."""
    metrics = {}
    if design in FIXED_SIZE_DESIGNS:
        p, status = fixed_size_probs(p, multiple_of)
        fallback_key, not_multiple_key = _FIXED_SIZE_KEYS[level]
        metrics[fallback_key] = float((status == FIXED_SIZE_FALLBACK).double().mean())
        metrics[not_multiple_key] = float((status == FIXED_SIZE_NOT_MULTIPLE).double().mean())
        multiple_of = 1
    mask, p_used = sample_mask(p, design, generator, multiple_of, nonempty=nonempty)
    return mask, p_used, metrics


def prune_prompts(
    scores: torch.Tensor | PromptSignals,
    keep_frac: float,
    q_min: float,
    design: str,
    generator: torch.Generator,
    multiple_of: int = 1,
    unseen_score: float | None = None,
    policy: str = "proportional",
) -> tuple[Draw, dict]:
    """scores: the ``PromptSignals`` of the B drawn prompts (``PromptHistory.signals``), or (B,) scores
    alone (+inf = unseen; ``unseen_score``: see ``prompt_keep_probs``); policy: a name in
    ``PROMPT_POLICIES``.
    returns (Draw over the B drawn prompts, metrics with ``dppo/prompt_keep_frac`` realised,
    ``dppo/prompt_keep_frac_expected`` and, for a fixed-size design,
    ``dppo/prompt_fixed_size_fallback|not_multiple`` (``sampling.fixed_size_probs``)).

    The draw never keeps nothing (``sample_mask(nonempty=True)``): OpenRLHF's loop would answer an empty
    step by drawing the next batch, which biases the step by 1 / P(non-empty). ``Draw.prob`` is the
    inclusion probability of that never-empty design."""
    if isinstance(scores, PromptSignals):
        if unseen_score is not None:
            raise ValueError(
                "unseen_score is for scores alone; PromptSignals carry the unseen prompts' values"
            )
        signals = scores
    else:
        signals = PromptSignals.of_scores(scores, unseen_score)
    q, m = prompt_policy_keep_probs(signals, keep_frac, policy, q_min)
    mask, q_used, fixed = _draw(q, design, generator, multiple_of, "prompt", nonempty=True)
    m.update(fixed)
    m[PROMPT_KEEP_FRAC_EXPECTED] = float(q_used.sum() / max(q_used.numel(), 1))
    return Draw(mask, q_used, inverse_prob_weights(q_used, mask)), {**m, **keep_metrics(prompt_mask=mask)}


def prune_completions(
    adv: torch.Tensor,
    keep_frac: float,
    policy: str,
    p_min: float,
    allow_zero: bool,
    design: str,
    generator: torch.Generator,
    multiple_of: int = 1,
    prompt_weight: torch.Tensor | None = None,
) -> tuple[Draw, dict]:
    """adv: (N,) one full-group advantage per rolled-out completion; prompt_weight: optional (N,) the
    weight 1 / q_j of each completion's prompt, folded into ``Draw.weight`` and the weight metrics.
    returns (Draw over the N completions, metrics with ``dppo/completion_keep_frac`` realised,
    ``dppo/completion_fixed_size_fallback|not_multiple`` for a fixed-size design, and
    ``dppo/weight_mean|max|ess`` over the kept items' final weights)."""
    p, m = completion_keep_probs(adv, keep_frac, policy, p_min, allow_zero)
    mask, p_used, fixed = _draw(p, design, generator, multiple_of, "completion")
    m.update(fixed)
    m[COMPLETION_KEEP_FRAC_EXPECTED] = float(p_used.sum() / max(p_used.numel(), 1))
    w = inverse_prob_weights(p_used, mask)
    if prompt_weight is not None:
        if prompt_weight.shape != w.shape:
            raise ValueError(f"prompt_weight {tuple(prompt_weight.shape)} must match adv {tuple(adv.shape)}")
        w = w * prompt_weight.to(torch.float64)
    metrics = {**m, **keep_metrics(completion_mask=mask), **weight_metrics(w[mask])}
    return Draw(mask, p_used, w), metrics
