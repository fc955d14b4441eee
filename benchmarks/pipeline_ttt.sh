#!/usr/bin/env bash
# Time to target on the embedded tiny task (benchmarks/RESULTS.md): GRPO then DPPO (r_q = r_o = 0.5)
# through examples/scripts/train_tiny_cpu.sh with the same seed, then `openrlhf-dppo compare`.
# Usage: bash benchmarks/pipeline_ttt.sh [STEPS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
export STEPS=${1:-300} SEED=${2:-1}
ALGO=grpo OUT=runs/pipeline/ttt_grpo_s$SEED bash examples/scripts/train_tiny_cpu.sh
ALGO=dppo OUT=runs/pipeline/ttt_dppo_s$SEED bash examples/scripts/train_tiny_cpu.sh
.venv/bin/python -m openrlhf_dppo.cli.compare runs/pipeline/ttt_grpo_s$SEED runs/pipeline/ttt_dppo_s$SEED \
  --out runs/pipeline/ttt_report_s$SEED
