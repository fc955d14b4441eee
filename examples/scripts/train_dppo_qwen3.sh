#!/usr/bin/env bash
# DPPO on Qwen3-4B / MATH. The recipe is configs/dppo_qwen3_4b_math.yaml (what runs, and why); the GRPO
# baseline is train_grpo_qwen3.sh. Environment overrides: MODEL, DATA_DIR, OUTPUT_DIR, NNODES,
# GPUS_PER_NODE, VLLM_ENGINES (the recipe's vars), PYTHON. Extra arguments are appended (the last value
# of a flag wins). DRY_RUN=1 prints the command only.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=()
[[ "${DRY_RUN:-0}" == 1 ]] && DRY=(--dry-run)
exec "${PYTHON:-python}" -m openrlhf_dppo.recipe "$ROOT/configs/dppo_qwen3_4b_math.yaml" "${DRY[@]}" "$@"
