"""One call per pruning level for the adapters: keep probabilities -> draw -> weights -> metrics, so
that the weights always use the probabilities actually drawn with (``sample_mask``'s p_used).

``prune_prompts``     before rollout, from the history's scores of the drawn prompts
                      (``PromptHistory.signals``) under a policy of ``PROMPT_POLICIES``.
``prune_completions`` after reward, from the full-group advantages of the rolled-out prompts.
Both are thin compositions of ``keep_probs``, ``sampling`` and ``weights``; nothing here is new math.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from openrlhf_dppo.core.keep_probs import completion_keep_probs, prompt_keep_probs
from openrlhf_dppo.core.metrics import keep_metrics
from openrlhf_dppo.core.sampling import (
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
    PROMPT_KEEP_FRAC_EXPECTED,
)


class Draw(NamedTuple):
    """mask: (N,) bool kept; prob: (N,) float64 the inclusion probabilities used (after any
    fixed-size rescale); weight: (N,) float64, 1 / prob on kept items (times the prompt weight for
    completions when given), 0 elsewhere."""

    mask: torch.Tensor
    prob: torch.Tensor
    weight: torch.Tensor


def prune_prompts(
    scores: torch.Tensor,
    keep_frac: float,
    q_min: float,
    generator: torch.Generator,
    policy: str = "proportional",
    unseen: torch.Tensor | None = None,
) -> tuple[Draw, dict]:
    """scores: (B,) the drawn prompts' scores (``PromptHistory.signals``); policy: a name in
    ``PROMPT_POLICIES``; unseen: optional (B,) bool, the prompts never rolled out (a metric only).
    returns (Draw over the B drawn prompts, metrics with ``dppo/prompt_keep_frac`` realised and
    ``dppo/prompt_keep_frac_expected`` after the rescale to a whole kept count). The draw never keeps
    nothing (``core.sampling``, "Never empty")."""
    q, m = prompt_keep_probs(scores, keep_frac, q_min, policy, unseen=unseen)
    mask, q_used = sample_mask(q, generator)
    m[PROMPT_KEEP_FRAC_EXPECTED] = float(q_used.sum() / max(q_used.numel(), 1))
    return Draw(mask, q_used, inverse_prob_weights(q_used, mask)), {**m, **keep_metrics(prompt_mask=mask)}


def prune_completions(
    adv: torch.Tensor,
    keep_frac: float,
    p_min: float,
    allow_zero: bool,
    generator: torch.Generator,
    multiple_of: int = 1,
    prompt_weight: torch.Tensor | None = None,
) -> tuple[Draw, dict]:
    """adv: (N,) one full-group advantage per rolled-out completion; prompt_weight: optional (N,) the
    weight 1 / q_j of each completion's prompt, folded into ``Draw.weight`` and the weight metrics.
    returns (Draw over the N completions, metrics with ``dppo/completion_keep_frac`` realised,
    ``dppo/completion_fixed_size_fallback|not_multiple``, and
    ``dppo/weight_mean|max|ess`` over the kept items' final weights)."""
    p, m = completion_keep_probs(adv, keep_frac, p_min, allow_zero)
    # the rescale to a multiple of the data-parallel size, reported; sample_mask leaves its result unchanged
    p, status = fixed_size_probs(p, multiple_of)
    m[COMPLETION_FIXED_SIZE_FALLBACK] = float((status == FIXED_SIZE_FALLBACK).double().mean())
    m[COMPLETION_FIXED_SIZE_NOT_MULTIPLE] = float((status == FIXED_SIZE_NOT_MULTIPLE).double().mean())
    mask, p_used = sample_mask(p, generator)
    m[COMPLETION_KEEP_FRAC_EXPECTED] = float(p_used.sum() / max(p_used.numel(), 1))
    w = inverse_prob_weights(p_used, mask)
    if prompt_weight is not None:
        if prompt_weight.shape != w.shape:
            raise ValueError(f"prompt_weight {tuple(prompt_weight.shape)} must match adv {tuple(adv.shape)}")
        w = w * prompt_weight.to(torch.float64)
    metrics = {**m, **keep_metrics(completion_mask=mask), **weight_metrics(w[mask])}
    return Draw(mask, p_used, w), metrics
