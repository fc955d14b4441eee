"""DPPO core: pure-torch math of Dynamic Pruning Policy Optimization (docs/METHOD.md).

What is implemented, and where it departs from the paper (arXiv 2603.04135, whose exact formulas are
not public; docs/METHOD.md is the specification):
1. Group advantages on the full group, OpenRLHF 0.11.2's formulas, in float64 (``estimator``);
   REINFORCE++-baseline's token-level batch whitening estimated from the kept completions by
   Horvitz-Thompson ratios (``token_whitening``: consistent, not exactly unbiased, as the token-mean
   normaliser).
2. Prompt pruning before rollout, keep probabilities from a policy of ``PROMPT_POLICIES`` over the scores
   a per-prompt history gives (``history``): ``proportional`` q = clip(c * score, q_min, 1) (the paper's
   shape, the default) or ``uniform`` (the equal-cost control); a prompt never seen takes the mean seen
   score, so the first epoch is pruned too (beyond the paper).
3. Completion pruning after reward by the paper's uniform-low rule (``keep_probs``), then a systematic
   draw with an exact kept count (``sampling``). Both levels share one exact solve
   (``solve_clipped_scale``) and one call each (``prune_prompts``, ``prune_completions``).
4. Weights 1 / (q p) folded into the advantages, full-batch normalisers (``estimator``): unbiased for
   seq-mean, consistent for token-mean (a Horvitz-Thompson token count).
5. Dense Prompt Packing with equal micro-batch counts per rank (``packing``: the paper's window-based
   greedy, with a fill step on closing a bin beyond the paper).
6. The prompt prune rate of each draw (``PromptRateControl`` in ``history``): fixed, or the measured share
   of groups without gradient (``zero-share``, the default, beyond the paper), set from earlier steps only.
7. The training reward of a pruned step as the Horvitz-Thompson estimate of the DRAWN batch's mean reward
   (``reward_stats``), so DPPO's and GRPO's training curves measure the same quantity.
Every function takes plain arguments; metrics are detached floats under ``dppo/...`` (the reward
statistics under OpenRLHF's ``rollout/...``), keys named in ``openrlhf_dppo.metric_keys``.
Imports torch and numpy only: never the adapters or the host (OpenRLHF, Ray, DeepSpeed, vLLM).
"""

from openrlhf_dppo.core.config import DPPOConfig
from openrlhf_dppo.core.estimator import (
    BATCH_WHITENED,
    ESTIMATORS,
    combine_weights,
    fold_weights,
    full_batch_normalizer,
    group_advantages,
    inverse_prob_weights,
    keep_metrics,
    reward_stats,
    token_whitening,
    weight_metrics,
    weighted_aggregate,
)
from openrlhf_dppo.core.history import (
    RATE_CONTROLS,
    ZERO_SHARE_CAP,
    PromptHistory,
    PromptRateControl,
    PromptSignals,
)
from openrlhf_dppo.core.keep_probs import (
    PROMPT_POLICIES,
    Registry,
    completion_keep_probs,
    prompt_keep_probs,
    solve_clipped_scale,
)
from openrlhf_dppo.core.packing import PackPlan, fitting_bins, micro_batch_capacity, pack
from openrlhf_dppo.core.sampling import (
    FIXED_SIZE_FALLBACK,
    FIXED_SIZE_HELD,
    FIXED_SIZE_NOT_MULTIPLE,
    Draw,
    fixed_size_probs,
    prune_completions,
    prune_prompts,
    sample_mask,
    step_generator,
)
from openrlhf_dppo.metric_keys import REQUIRED_KEYS

__all__ = [
    "BATCH_WHITENED",
    "ESTIMATORS",
    "FIXED_SIZE_FALLBACK",
    "FIXED_SIZE_HELD",
    "FIXED_SIZE_NOT_MULTIPLE",
    "PROMPT_POLICIES",
    "RATE_CONTROLS",
    "REQUIRED_KEYS",
    "ZERO_SHARE_CAP",
    "DPPOConfig",
    "Draw",
    "PackPlan",
    "PromptHistory",
    "PromptRateControl",
    "PromptSignals",
    "Registry",
    "combine_weights",
    "completion_keep_probs",
    "fitting_bins",
    "fixed_size_probs",
    "fold_weights",
    "full_batch_normalizer",
    "group_advantages",
    "inverse_prob_weights",
    "keep_metrics",
    "micro_batch_capacity",
    "pack",
    "prompt_keep_probs",
    "prune_completions",
    "prune_prompts",
    "reward_stats",
    "sample_mask",
    "solve_clipped_scale",
    "step_generator",
    "token_whitening",
    "weight_metrics",
    "weighted_aggregate",
]
