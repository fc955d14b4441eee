"""Every metric key, named once: the keys of a ``metrics.jsonl`` line and of the metric dicts that core
functions return and the adapters log.

Constants only, and it imports nothing, so every layer may use it: core (pure torch), ``run_dir``
(standard library only, which re-exports these names) and the report on a laptop without the host.
Anywhere else a key is written as one of these names, never as a string literal:
``tests/foundation/test_metric_keys.py`` fails on a quoted ``"dppo/..."``, ``"rollout/..."``,
``"timing/..."`` (...) string in any other module of the package, the benchmarks or the scripts.
"""

# ---- the fields every metrics.jsonl line carries, and the line kinds ---------------------------------
TRAIN, EVAL = "train", "eval"
KIND, STEP, TIME, WALL_TIME = "kind", "step", "time", "wall_time"

# ---- timing: OpenRLHF's phase timers (their sum is the step) and the writer's time axis ------------
TIMING_PREFIX = "timing/"  # OpenRLHF sums every timing/* key of a step into timing/step_total
GENERATION = "timing/generation"
MAKE_EXPERIENCE = "timing/make_experience"
PPO_TRAIN = "timing/ppo_train"
BROADCAST = "timing/broadcast"
STEP_TOTAL = "timing/step_total"
PHASES = (GENERATION, MAKE_EXPERIENCE, PPO_TRAIN, BROADCAST)
EVAL_TIME = "timing/eval"  # eval lines: seconds the evaluation took
TRAIN_S = "time/train_s"
STARTUP_S = "time/startup_s"

# ---- learning -----------------------------------------------------------------------------------
REWARD_MEAN = "rollout/reward_mean"  # mean raw reward over the rolled-out completions
REWARD_STD = "rollout/reward_std"  # its unbiased standard deviation
REWARD_HT = "rollout/reward_ht"  # Horvitz-Thompson estimate of the drawn batch's mean reward
# the share of the rolled-out groups whose G raw rewards are all equal (every advantage 0 under a group
# estimator: no policy gradient), and its Horvitz-Thompson estimate for the drawn batch
EQUAL_REWARD_FRAC = "rollout/equal_reward_frac"
EQUAL_REWARD_FRAC_HT = "rollout/equal_reward_frac_ht"
RESPONSE_LENGTH_MEAN = "rollout/response_length_mean"
TRUNCATED_RATE = "rollout/truncated_rate"
NUM_SAMPLES = "rollout/num_samples"
EVAL_PREFIX, PASS1_SUFFIX = "eval_", "_pass1"  # held-out accuracy: eval_<dataset>_pass1
EVAL_NUM_SAMPLES = "eval_num_samples"  # eval lines: prompts x samples per prompt, all datasets

# ---- accounting: generated = trained + pruned + filtered + untrained ---------------------------
TOKENS_GENERATED, TOKENS_TRAINED, TOKENS_PRUNED = "tokens/generated", "tokens/trained", "tokens/pruned"
SAMPLES_GENERATED, SAMPLES_TRAINED, SAMPLES_PRUNED = "samples/generated", "samples/trained", "samples/pruned"
PROMPTS_DRAWN, PROMPTS_ROLLED_OUT, PROMPTS_PRUNED = "prompts/drawn", "prompts/rolled_out", "prompts/pruned"
SAMPLES_FILTERED, TOKENS_FILTERED = "samples/filtered", "tokens/filtered"  # dynamic filtering dropped them
SAMPLES_FILLERS = "samples/fillers"  # forwarded with weight 0, not counted as trained
TOKENS_FILLERS = "tokens/fillers"
# held by the actors and never trained: OpenRLHF's whole-train-batch rule (--dppo.short_batch drop)
SAMPLES_UNTRAINED, TOKENS_UNTRAINED = "samples/untrained", "tokens/untrained"
TOKEN_KEYS = (TOKENS_GENERATED, TOKENS_TRAINED, TOKENS_PRUNED)
SAMPLE_KEYS = (SAMPLES_GENERATED, SAMPLES_TRAINED, SAMPLES_PRUNED)
TOKENS_PER_SEC = "perf/tokens_per_sec"
# the step's experience-side forward batches (one actor / reference forward call each, over all ranks) and
# the tokens of its largest: OpenRLHF's count (GRPO) may put more than --rollout.max_tokens_per_gpu x ring
# x TP in one, DPPO's keeps each within it and may make more calls
FORWARD_BATCHES, FORWARD_TOKENS_MAX = "perf/forward_batches", "perf/forward_tokens_max"

# ---- DPPO: pruning levels (core/keep_probs.py, core/sampling.py) -----------------------------------
PROMPT_KEEP_FRAC = "dppo/prompt_keep_frac"  # realised kept fraction of the drawn prompts
PROMPT_KEEP_FRAC_EXPECTED = "dppo/prompt_keep_frac_expected"  # sum q / B
PROMPT_PRUNE_RATE_TARGET = "dppo/prompt_prune_rate_target"  # the draw's r_q (--dppo.prompt_rate_control)
PROMPT_KEEP_INFEASIBLE = "dppo/prompt_keep_infeasible"  # 1.0 when the target could not be met
PROMPT_UNSEEN_FRAC = "dppo/prompt_unseen_frac"
COMPLETION_KEEP_FRAC = "dppo/completion_keep_frac"
COMPLETION_KEEP_FRAC_EXPECTED = "dppo/completion_keep_frac_expected"
COMPLETION_KEEP_INFEASIBLE = "dppo/completion_keep_infeasible"
COMPLETION_ZERO_ADV_FRAC = "dppo/completion_zero_adv_frac"  # A == 0 exactly
COMPLETION_ZERO_PROB_FRAC = "dppo/completion_zero_prob_frac"  # given p = 0 (the A == 0 drop is on)
COMPLETION_FIXED_SIZE_FALLBACK = "dppo/completion_fixed_size_fallback"
COMPLETION_FIXED_SIZE_NOT_MULTIPLE = "dppo/completion_fixed_size_not_multiple"
COMPLETION_FILLERS = "dppo/completion_fillers"

# ---- DPPO: weights and normalisers (core/estimator.py) --------------------------------------------
WEIGHT_MEAN, WEIGHT_MAX, WEIGHT_ESS = "dppo/weight_mean", "dppo/weight_max", "dppo/weight_ess"
WEIGHT_ESS_FRAC = "dppo/weight_ess_frac"
NORMALIZER = "dppo/normalizer"
NORMALIZER_TOKENS, NORMALIZER_SEQS = "dppo/normalizer_tokens", "dppo/normalizer_seqs"
# per sequence: w_j * v_ji, weights the KL / entropy terms; OpenRLHF's training_step logs every tensor of
# Experience.info, so the step's line holds its mean over the trained micro-batches (zero-weight fillers too)
SAMPLE_WEIGHT = "dppo/sample_weight"
# REINFORCE++-baseline: the batch's token mean m and inverse std 1/s of the returns (core/estimator.py)
ADVANTAGE_TOKEN_MEAN, ADVANTAGE_TOKEN_RSTD = "dppo/advantage_token_mean", "dppo/advantage_token_rstd"

# ---- DPPO: packing (core/packing.py, adapters/dispatch.py) -----------------------------------------
PACK_DENSITY, PACK_MICRO_BATCHES = "dppo/pack_density", "dppo/pack_micro_batches"
PACK_LOWER_BOUND, PACK_RANK_IMBALANCE = "dppo/pack_lower_bound", "dppo/pack_rank_imbalance"
PACK_EMPTY_MICRO_BATCHES = "dppo/pack_empty_micro_batches"
PACK_SEQUENCES = "dppo/pack_sequences"
OPTIMIZER_STEPS = "dppo/optimizer_steps"

# ---- GRESO (--dppo.method greso; core/greso.py) -------------------------------------------------------
# p_easy, p_hard: the step's skip parameters (before the step's own update); the shares: of the step's
# rolled-out groups (dynamic filtering's dropped ones included), all-equal at the top / at the bottom;
# adapted: 1.0 when the step moved p_easy, p_hard (from the second pass over the prompts on)
GRESO_P_EASY, GRESO_P_HARD = "greso/p_easy", "greso/p_hard"
GRESO_EASY_SHARE, GRESO_HARD_SHARE = "greso/easy_share", "greso/hard_share"
GRESO_ADAPTED = "greso/adapted"

#: the keys the run directory's ``metrics.jsonl`` must carry for a DPPO run (docs/DESIGN.md)
REQUIRED_KEYS = (
    PROMPT_KEEP_FRAC,
    COMPLETION_KEEP_FRAC,
    WEIGHT_MEAN,
    WEIGHT_MAX,
    WEIGHT_ESS,
    PACK_DENSITY,
    PACK_MICRO_BATCHES,
    PACK_LOWER_BOUND,
    PACK_RANK_IMBALANCE,
)


def pass1_key(dataset: str) -> str:
    """dataset -> its held-out accuracy key ``eval_<dataset>_pass1``."""
    return f"{EVAL_PREFIX}{dataset}{PASS1_SUFFIX}"


def pass1_dataset(key: str) -> str | None:
    """``eval_<dataset>_pass1`` -> dataset; None for any other key."""
    if key.startswith(EVAL_PREFIX) and key.endswith(PASS1_SUFFIX) and len(key) > 10:
        return key[len(EVAL_PREFIX) : -len(PASS1_SUFFIX)]
    return None
