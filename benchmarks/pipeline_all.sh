#!/usr/bin/env bash
# The whole-step benchmark of benchmarks/ARCHIVE.md "Pipeline: whole-step GRPO vs DPPO on a loaded machine": GRPO runs interleaved with
# the DPPO runs (one heavy job at a time), then the tables. Usage: bash benchmarks/pipeline_all.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
STEPS=${1:-12}
B="$PY benchmarks/pipeline_step.py"
$B build
$B run --name grpo_1 --rates none --steps "$STEPS"
$B run --name dppo_0_05 --rates 0 0.5 --steps "$STEPS"
$B run --name dppo_05_0 --rates 0.5 0 --steps "$STEPS"
$B run --name grpo_2 --rates none --steps "$STEPS"
$B run --name dppo_05_05 --rates 0.5 0.5 --steps "$STEPS"
$B run --name dppo_07_07 --rates 0.7 0.7 --steps "$STEPS"
$B run --name grpo_3 --rates none --steps "$STEPS"
R=runs/pipeline
$B table --grpo $R/grpo_1 $R/grpo_2 $R/grpo_3 \
  --dppo $R/dppo_0_05 $R/dppo_05_0 $R/dppo_05_05 $R/dppo_07_07
