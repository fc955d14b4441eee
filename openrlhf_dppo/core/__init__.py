"""DPPO core: pure-torch math of Dynamic Pruning Policy Optimization (docs/METHOD.md is the specification).
Plain arguments in; metrics are detached floats under keys of ``openrlhf_dppo.metric_keys``. Imports
torch and numpy only, never the adapters or the host.
"""

from openrlhf_dppo.core.config import METHODS, DPPOConfig
from openrlhf_dppo.core.estimator import (
    BATCH_WHITENED,
    ESTIMATORS,
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
    "METHODS",
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
