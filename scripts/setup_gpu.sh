#!/usr/bin/env bash
# Install the GPU stack into the current Python environment (a fresh venv or conda env on a CUDA node),
# with pip alone, in the order that works (docs/GPU_QUICKSTART.md, section 1):
#   1. torch 2.13.0, the CUDA build (vLLM 0.29.0 pins it)
#   2. vLLM 0.29.0
#   3. requirements/gpu.txt: OpenRLHF 0.11.2's requirements minus flash-attn, ring-flash-attn,
#      openrlhf-dppo's own, and the build tools
#   4. OpenRLHF 0.11.2 and openrlhf-dppo (editable), both --no-deps (OpenRLHF pins flash-attn==2.8.3)
#   5. flash-attn, compiled against the installed torch with nvcc (--no-build-isolation)
#   6. check the imports; build DeepSpeed's FusedAdam once (JIT, nvcc + ninja)
# Versions: requirements/gpu-constraints.txt, passed to every pip call.
#
#   bash scripts/setup_gpu.sh            install (make setup-gpu)
#   bash scripts/setup_gpu.sh --check    only check the toolchain flash-attn and DeepSpeed build with
#                                        (torch's CUDA build, nvcc of the same CUDA major version, ninja)
#   bash scripts/setup_gpu.sh --dry-run  print the pip commands, run nothing
#   bash scripts/setup_gpu.sh --verify   only step 6, on what is installed (after a fix, without rebuilding)
# Environment: PYTHON (default python3), MAX_JOBS (parallel nvcc jobs of the flash-attn build; each can take
# ~9 GB of RAM), FLASH_ATTN_CUDA_ARCHS (default 80;90;100;120; "90" alone for H100/H200 builds ~4x faster),
# CUDA_HOME (else nvcc on PATH), SKIP_FUSED_ADAM=1 (skip step 6's FusedAdam build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
C=requirements/gpu-constraints.txt
MODE=${1:-install}
case "$MODE" in
  install | --check | --dry-run | --verify) ;;
  *) echo "usage: bash scripts/setup_gpu.sh [--check | --dry-run | --verify]" >&2; exit 2 ;;
esac

pip_install() {  # pip install -c CONSTRAINTS ARGS..., or print it under --dry-run
  if [ "$MODE" = --dry-run ]; then
    echo "$PY -m pip install -c $C $*"
  else
    "$PY" -m pip install --disable-pip-version-check -c "$C" "$@"
  fi
}

# Prints every problem of the build toolchain, one line each, and exits 1 if there is one.
check_toolchain() {
  CUDA_HOME=${CUDA_HOME:-} "$PY" - <<'PY'
import os, re, shutil, subprocess, sys

problems = []
try:
    import torch
except ImportError:
    sys.exit("[setup-gpu] torch is not installed in this environment: step 1 installs it "
             "(bash scripts/setup_gpu.sh)")
cuda = torch.version.cuda
if cuda is None:
    problems.append(f"torch {torch.__version__} is not a CUDA build (torch.version.cuda is None): install "
                    "torch==2.13.0 from PyPI, whose Linux x86_64 wheel is the CUDA build, not a +cpu wheel")
home = os.environ.get("CUDA_HOME")
nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
if not nvcc or not os.path.exists(nvcc):
    where = f"$CUDA_HOME/bin/nvcc ({home}/bin/nvcc)" if home else "nvcc on PATH"
    problems.append(f"no {where}: flash-attn and DeepSpeed's FusedAdam are compiled with nvcc; install the "
                    f"CUDA toolkit {cuda or '(torch.version.cuda)'} and set CUDA_HOME to it")
    nvcc = None
if nvcc and cuda:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+)\.(\d+)", out)
    if not found:
        problems.append(f"{nvcc} --version does not say its release: {out.strip()[-200:]!r}")
    else:
        major, minor = found.groups()
        if major != cuda.split(".")[0]:
            problems.append(f"{nvcc} is CUDA {major}.{minor}, torch {torch.__version__} was built with CUDA "
                            f"{cuda}: the major versions must agree (torch refuses to build extensions "
                            f"otherwise); install the CUDA {cuda} toolkit or point CUDA_HOME at it")
        elif minor != cuda.split(".")[1]:
            print(f"[setup-gpu] note: nvcc is CUDA {major}.{minor}, torch's is {cuda} (same major: it builds)")
ninja = shutil.which("ninja")
if not ninja or subprocess.run([ninja, "--version"], capture_output=True).returncode != 0:
    problems.append("no working ninja on PATH: pip install ninja (flash-attn and DeepSpeed build with it)")
for p in problems:
    print(f"[setup-gpu] error: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible (a build node is fine)"
print(f"[setup-gpu] toolchain ok: torch {torch.__version__} (CUDA {cuda}), {nvcc}, ninja; GPU: {gpu}")
PY
}

# Step 6: imports what training imports, the way it imports it, and builds FusedAdam.
verify() {
  SKIP_FUSED_ADAM=${SKIP_FUSED_ADAM:-0} "$PY" - <<'PY'
import os
from importlib.metadata import version

import flash_attn_2_cuda  # noqa: F401  the compiled kernels, not only the Python package
import torch
import vllm  # noqa: F401

from openrlhf_dppo._host import check_openrlhf_version

check_openrlhf_version()
# As OpenRLHF 0.11.2 does before it imports ring_flash_attn (--ds.ring_attn_size > 1): its own patch gives
# transformers back the name ring-flash-attn 0.1.8 imports from transformers.modeling_flash_attention_utils
from openrlhf.models.ring_attn_utils import patch_transformers_for_ring_flash_attn

patch_transformers_for_ring_flash_attn()
import ring_flash_attn  # noqa: E402, F401

names = ("torch", "vllm", "flash-attn", "ring-flash-attn", "deepspeed", "openrlhf", "transformers", "ray")
print("[setup-gpu] " + " | ".join(f"{n} {version(n)}" for n in names))
if os.environ["SKIP_FUSED_ADAM"] != "1" and torch.cuda.is_available():
    from deepspeed.ops.op_builder import FusedAdamBuilder

    FusedAdamBuilder().load()  # JIT-compiled once into ~/.cache/torch_extensions; every run reuses it
    print("[setup-gpu] DeepSpeed FusedAdam built")
else:
    print("[setup-gpu] DeepSpeed FusedAdam not built now: it is compiled (nvcc, ninja) at the first training step")
PY
}

if [ "$MODE" = --check ]; then
  check_toolchain
  exit
fi
if [ "$MODE" = --verify ]; then
  verify
  echo "[setup-gpu] done"
  exit
fi

echo "[setup-gpu] 1/6 torch 2.13.0 (CUDA build)"
pip_install torch
if [ "$MODE" = install ]; then
  "$PY" -c "import sys, torch; sys.exit(None if torch.version.cuda else f'[setup-gpu] error: torch {torch.__version__} \
is not a CUDA build; pip took it from an index or --find-links that serves CPU wheels: install torch==2.13.0 from PyPI')"
fi
echo "[setup-gpu] 2/6 vLLM 0.29.0"
pip_install vllm
echo "[setup-gpu] 3/6 OpenRLHF 0.11.2's requirements minus flash-attn, ring-flash-attn, openrlhf-dppo's, build tools"
pip_install -r requirements/gpu.txt
echo "[setup-gpu] 4/6 OpenRLHF 0.11.2 and openrlhf-dppo (editable), both --no-deps"
pip_install --no-deps openrlhf
pip_install --no-deps -e .
echo "[setup-gpu] 5/6 flash-attn: compiled against this torch with nvcc (tens of minutes; MAX_JOBS, FLASH_ATTN_CUDA_ARCHS)"
if [ "$MODE" = install ]; then
  check_toolchain
fi
pip_install --no-build-isolation flash-attn
echo "[setup-gpu] 6/6 check the imports and build DeepSpeed's FusedAdam"
if [ "$MODE" = --dry-run ]; then
  exit
fi
verify
echo "[setup-gpu] done"
