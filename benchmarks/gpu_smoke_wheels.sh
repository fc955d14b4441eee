#!/usr/bin/env bash
# Fill .whl/ with what benchmarks/gpu_smoke.sh needs on a GPU machine that has CUDA torch and
# transformers but no OpenRLHF, DeepSpeed, Ray or vLLM, and no network. Run it HERE (a machine that
# reaches PyPI), from anywhere in the repository; it prints the total size that then travels with the
# working tree (the device tool takes 64 MiB in all, the repository's tracked files included).
#
#   bash benchmarks/gpu_smoke_wheels.sh          # then: device run with carry [".whl"] (gpu_smoke.sh header)
#
# What is carried and why (each pinned to the version the CPU environment runs):
#   openrlhf 0.11.2 (--no-deps)      the host
#   deepspeed 0.19.6                 sdist only on PyPI: a pure-Python wheel built with DS_BUILD_OPS=0
#                                    (no compiled op; FusedAdam is JIT-built there with nvcc + ninja)
#   hjson, pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions
#                                    DeepSpeed's imports that the GPU image lacks (pydantic needs a
#                                    typing-extensions >= 4.16)
#   pylatexenc, torchdata            imported by openrlhf.utils (math grading) and the DeepSpeed strategy
#   transformers 5.15.0, tokenizers 0.22.2
#                                    OpenRLHF 0.11.2's pin (the image has 5.17 and tokenizers 0.23, which
#                                    5.15 refuses at import); PINNED_TRANSFORMERS=0 leaves them out
# Ray (~70 MB) and vLLM cannot travel: the smoke uses import stand-ins (benchmarks/gpu_smoke/stubs).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-python3}
WHL=.whl
LIMIT_MIB=64

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

WHEELS=(
  openrlhf==0.11.2
  hjson==3.1.0
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  pylatexenc==2.11
  torchdata==0.11.0
)
if [[ "${PINNED_TRANSFORMERS:-1}" == 1 ]]; then
  WHEELS+=(transformers==5.15.0 tokenizers==0.22.2)
fi

rm -rf "$WHL"
mkdir -p "$WHL"
echo "[gpu_smoke_wheels] downloading ${#WHEELS[@]} wheels for CPython 3.12, x86-64"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHL" "${WHEELS[@]}"

# DeepSpeed: a wheel pip built earlier (make setup-cpu builds this one) or a fresh build; either way
# with no compiled op, so nothing in it depends on this machine's torch or compiler.
ds=$("$PY" -m pip cache list 'deepspeed-0.19.6-*' --format abspath 2>/dev/null | head -1 || true)
if [[ -n "$ds" && -f "$ds" ]]; then
  echo "[gpu_smoke_wheels] deepspeed 0.19.6 from pip's wheel cache: $ds"
  cp "$ds" "$WHL/"
else
  # in pip's isolated build environment, where torch is absent: DeepSpeed's setup.py then pre-compiles
  # nothing (a --no-build-isolation build against .venv's torch fails with its setuptools)
  echo "[gpu_smoke_wheels] building deepspeed 0.19.6 from its sdist (DS_BUILD_OPS=0, about 30 s)"
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w "$WHL" deepspeed==0.19.6
fi
"$PY" - "$WHL" <<'PY'
import glob, sys, zipfile
(path,) = glob.glob(f"{sys.argv[1]}/deepspeed-0.19.6-*.whl")
if not path.endswith("-py3-none-any.whl"):
    sys.exit(f"expected a pure-Python deepspeed wheel (py3-none-any), got {path}")
with zipfile.ZipFile(path) as z:
    compiled = [n for n in z.namelist() if n.endswith(".so")]
    info = z.read("deepspeed/git_version_info_installed.py").decode()
if compiled or "True" in info.split("installed_ops=")[1].split("\n")[0]:
    sys.exit(f"expected a deepspeed wheel without prebuilt ops (DS_BUILD_OPS=0); {path} has {compiled or info}")
PY

wheels_kib=$(du -sk "$WHL" | cut -f1)
tracked_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
total_kib=$((wheels_kib + tracked_kib))
ls -1 "$WHL"
printf '[gpu_smoke_wheels] .whl %.1f MiB + tracked files %.1f MiB = %.1f MiB (limit %d MiB; untracked files that git does not ignore travel too)\n' \
  "$(echo "$wheels_kib / 1024" | bc -l)" "$(echo "$tracked_kib / 1024" | bc -l)" "$(echo "$total_kib / 1024" | bc -l)" "$LIMIT_MIB"
if ((total_kib > LIMIT_MIB * 1024)); then
  echo "[gpu_smoke_wheels] over the limit: try PINNED_TRANSFORMERS=0" >&2
  exit 1
fi
