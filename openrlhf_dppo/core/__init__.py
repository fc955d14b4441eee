"""DPPO core: pure-torch math of Dynamic Pruning Policy Optimization (METHOD.md).

What is implemented, and where it departs from the paper (arXiv 2603.04135, whose exact formulas are
not public; METHOD.md is the specification):
1. Group advantages on the full group, OpenRLHF 0.11.2's formulas (``advantages``); REINFORCE++-baseline's
   token-level batch whitening estimated from the kept completions by Horvitz-Thompson ratios
   (``token_whitening``: consistent, not exactly unbiased, as the token-mean ``ht`` normaliser).
2. Prompt pruning before rollout, keep probabilities from a policy of ``PROMPT_POLICIES`` (one module
   per policy in ``prompt_policies/``) over what a per-prompt history knows (``history.PromptSignals``):
   ``proportional`` q = clip(c * score, q_min, 1) (the default), ``sqrt`` the variance-optimal rule at a
   fixed expected cost (beyond the paper), ``uniform`` the equal-cost control; unseen prompts kept
   (q = 1) or scored like an average seen one.
3. Completion pruning after reward, keep probabilities from a policy of ``COMPLETION_POLICIES`` (one
   module per policy in ``policies/``, whose docstring says where it departs from the paper), then a
   draw from a design of ``SAMPLING_DESIGNS`` (``sampling``; fixed-size designs keep an exact count).
   The prompt level and the score-based policies share one exact solve (``clipped_scale``).
4. Weights 1 / (q p) folded into the advantages, full-batch normalisers (``weights``): unbiased.
5. Dense Prompt Packing with equal micro-batch counts per rank (``packing``; packers in ``PACKERS``,
   the paper's window-based greedy one is ``window``).
6. One call per level for the adapters (``levels``): probabilities -> draw -> weights -> metrics.
7. The prompt prune rate of each draw (``rate_control``): fixed, or the measured share of groups
   without gradient (``zero-share``, beyond the paper), set from earlier steps only.
8. The training reward of a pruned step as the Horvitz-Thompson estimate of the DRAWN batch's mean
   reward (``metrics.reward_stats``; METHOD.md "Measuring the promise"), so DPPO's and GRPO's training
   curves measure the same quantity.
Every function takes plain arguments; metrics are detached floats under ``dppo/...`` (the reward
statistics under OpenRLHF's ``rollout/...``), keys named in ``openrlhf_dppo.metric_keys``. The
registered names and their one-line help: ``python -m openrlhf_dppo.cli.flags_table``.
Imports torch and numpy only: never the adapters or the host (OpenRLHF, Ray, DeepSpeed, vLLM).
"""

from openrlhf_dppo.core.advantages import BATCH_WHITENED, ESTIMATORS, group_advantages, token_whitening
from openrlhf_dppo.core.config import DPPOConfig
from openrlhf_dppo.core.history import REWARD_KINDS, PromptHistory, PromptSignals
from openrlhf_dppo.core.keep_probs import (
    COMPLETION_POLICIES,
    PROMPT_POLICIES,
    completion_keep_probs,
    prompt_keep_probs,
    prompt_policy_keep_probs,
    solve_clipped_scale,
)
from openrlhf_dppo.core.levels import Draw, prune_completions, prune_prompts
from openrlhf_dppo.core.metrics import REQUIRED_KEYS, keep_metrics, reward_stats
from openrlhf_dppo.core.packing import PACKERS, PackPlan, fitting_bins, micro_batch_capacity, pack
from openrlhf_dppo.core.rate_control import RATE_CONTROLS, PromptRateControl
from openrlhf_dppo.core.registry import Registry
from openrlhf_dppo.core.sampling import (
    FIXED_SIZE_DESIGNS,
    FIXED_SIZE_FALLBACK,
    FIXED_SIZE_HELD,
    FIXED_SIZE_NOT_MULTIPLE,
    SAMPLING_DESIGNS,
    fixed_size_probs,
    sample_mask,
    step_generator,
)
from openrlhf_dppo.core.weights import (
    TOKEN_NORMALIZERS,
    combine_weights,
    fold_weights,
    full_batch_normalizer,
    inverse_prob_weights,
    weight_metrics,
    weighted_aggregate,
)

__all__ = [
    "BATCH_WHITENED",
    "COMPLETION_POLICIES",
    "ESTIMATORS",
    "FIXED_SIZE_DESIGNS",
    "FIXED_SIZE_FALLBACK",
    "FIXED_SIZE_HELD",
    "FIXED_SIZE_NOT_MULTIPLE",
    "PACKERS",
    "PROMPT_POLICIES",
    "RATE_CONTROLS",
    "REQUIRED_KEYS",
    "REWARD_KINDS",
    "SAMPLING_DESIGNS",
    "TOKEN_NORMALIZERS",
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
    "prompt_policy_keep_probs",
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
