#!/usr/bin/env bash
# The GRPO baseline of train_dppo_qwen3.sh: configs/grpo_qwen3_4b_math.yaml, i.e. the same recipe plus
# --dppo.method grpo, written to runs/qwen3_4b_math/grpo. Environment overrides, extra arguments and
# DRY_RUN=1: as in train_dppo_qwen3.sh.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=()
[[ "${DRY_RUN:-0}" == 1 ]] && DRY=(--dry-run)
exec "${PYTHON:-python}" -m openrlhf_dppo.recipe "$ROOT/configs/grpo_qwen3_4b_math.yaml" "${DRY[@]}" "$@"
