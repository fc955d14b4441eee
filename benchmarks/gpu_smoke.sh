#!/usr/bin/env bash
# GPU smoke: the first checks of the project's GPU path on one GPU, in at most 7 minutes, each stage
# under its own time limit. For a machine with CUDA torch and transformers but (maybe) no OpenRLHF,
# DeepSpeed, Ray or vLLM, and no network: what is missing travels as wheels in .whl/.
#
# On the device tool's nvidia-h200 (one H200, 15 minutes of device time per session, all tries):
#   1. here, once (PyPI reachable):  bash benchmarks/gpu_smoke_wheels.sh
#      .whl/ (19.5 MiB when written) + the tracked files (7.1 MiB) travel: 26.6 of the 64 MiB a call
#      takes; the helper prints the sum (untracked files that git does not ignore travel too)
#   2. the device call:              run(command="bash benchmarks/gpu_smoke.sh",
#                                        carry=[".whl"], timeout_s=480)
#      The files come back from $OUT (8 at most): summary.json, probe.json, smoke.log,
#      gpu_actor.json, actor.json, actor_fused.json. A fresh machine has nothing installed, so a
#      rerun of some stages keeps w: run(command='GPU_SMOKE_STAGES="w d" bash benchmarks/gpu_smoke.sh',
#      carry=[".whl"], timeout_s=300)
#   (Any CUDA node: the same command; OUT defaults to /tmp/gpu_smoke.)
#
# Stages (one line each: PASS, FAIL(reason), TIMEOUT(reason) or SKIP(reason); then a summary; exit 1 if
# any FAIL, else 3 if any TIMEOUT). TIMEOUT: the stage reached its own limit and was stopped, and the
# reason ends with its last line (how far it got); it says nothing about the code, unlike FAIL.
# Each stage has its own limit (seconds: a 60, w 120 per step, b 120, c 120, d 180, e 240) and starts
# only when that limit, plus 10 s to stop it, fits in what is left of the budget; otherwise it is a
# SKIP that names the time it needed: no stage is cut short by the stages before it.
#   a probe       nvidia-smi, python/torch/transformers, CUDA capability, nvcc/ninja, which of openrlhf,
#                 deepspeed, ray, vllm, flash_attn import (probe.json, section "image")
#   w carry       .whl/*.whl installed into $GPU_SMOKE_SITE (PYTHONPATH); where ray or vllm does not
#                 import, the smoke's import stand-ins (benchmarks/gpu_smoke/{ray,vllm}_stub); then the
#                 actor path's modules must import (probe.json, section "smoke")
#   b discipline  tests/adapters/test_device_discipline.py with DPPO_SECOND_DEVICE=cuda (the real GPU
#                 as the micro-batch's device); on CPU with its stand-in second device
#   c packing     benchmarks/gpu_actor.py at Qwen3-0.6B shapes: packed vs padded log-probs must agree
#                 (check.packed_ok), with a few timings (gpu_actor.json)
#   d actor       benchmarks/gpu_smoke_actor.py: OpenRLHF's ActorPPOTrainer through DPPOActorTrainer,
#                 DeepSpeed ZeRO-3 (torch AdamW), GRPO and DPPO arms on synthetic experiences, KL in
#                 the loss but no entropy term (actor.json; gpu_smoke_actor.py says why)
#   e fused_adam  the same with OpenRLHF's optimizer, DeepSpeed's FusedAdam, JIT-built with nvcc + ninja
#                 (its build time in actor_fused.json); CUDA only
#
# Environment: GPU_SMOKE_DEVICE=cuda|cpu (cpu: what a CPU can run, for CI: stage c at tiny size, d on
# gloo, e SKIP), GPU_SMOKE_STAGES (default "a w b c d e"), GPU_SMOKE_BUDGET_S (420: the whole run's
# limit, within the device call's timeout_s), GPU_SMOKE_LIMITS (stage limits to change, as "d=240 e=300"),
# GPU_SMOKE_SITE
# (/tmp/gpu_smoke_site), GPU_SMOKE_STAND_INS=auto|force (force: the stand-ins even where ray / vllm
# import, as on the GPU machine), GPU_SMOKE_WHEELS (.whl: the folder stage w installs),
# GPU_SMOKE_DISCIPLINE_TEST (the stage b file), PYTHON (python3).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-/tmp/gpu_smoke}
DEVICE=${GPU_SMOKE_DEVICE:-cuda}
STAGES=" ${GPU_SMOKE_STAGES:-a w b c d e} "
BUDGET=${GPU_SMOKE_BUDGET_S:-420}
SITE=${GPU_SMOKE_SITE:-/tmp/gpu_smoke_site}
STAND_INS=${GPU_SMOKE_STAND_INS:-auto}
DISCIPLINE_TEST=${GPU_SMOKE_DISCIPLINE_TEST:-tests/adapters/test_device_discipline.py}
WHEELS=${GPU_SMOKE_WHEELS:-.whl}
PY=${PYTHON:-python3}
case "$DEVICE" in cuda | cpu) ;; *) echo "gpu_smoke: GPU_SMOKE_DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac
case "$STAND_INS" in auto | force) ;; *) echo "gpu_smoke: GPU_SMOKE_STAND_INS must be auto or force, got '$STAND_INS'" >&2; exit 2 ;; esac
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "gpu_smoke: GPU_SMOKE_BUDGET_S must be a whole number of seconds, got '$BUDGET'" >&2; exit 2; }
KILL_S=10  # after its limit, a stage gets SIGTERM, and SIGKILL this much later
declare -A LIMITS=([a]=60 [w]=120 [b]=120 [c]=120 [d]=180 [e]=240)
for item in ${GPU_SMOKE_LIMITS:-}; do
  if [[ ! "$item" =~ ^([awbcde])=([1-9][0-9]*)$ ]]; then
    echo "gpu_smoke: GPU_SMOKE_LIMITS takes STAGE=SECONDS items (stages a w b c d e, seconds > 0), got '$item'" >&2
    exit 2
  fi
  LIMITS[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
done

mkdir -p "$OUT"
LOG=$OUT/smoke.log
: >"$LOG"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS
RESULTS=()  # id, name, status, reason, seconds: tab-separated
NO_CUDA=""  # set when stage a finds no CUDA device in cuda mode
NO_HOST=""  # set when stage w could not make the host importable

say() { echo "[gpu_smoke] $*"; }

record() {  # id name status reason seconds
  RESULTS+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"$'\t'"$5")
  local shown=$3
  [[ -n "$4" ]] && shown="$3($4)"
  say "stage $1 $(printf '%-10s' "$2") $shown  [${5}s]"
}

selected() { [[ "$STAGES" == *" $1 "* ]]; }

# run_stage ID NAME CMD...: CMD under `timeout` with the stage's own limit (LIMITS), its output appended
# to smoke.log; sets RC (124 or 137: stopped at the limit), SECS, LIMIT and TAIL (its last lines).
# Returns 1 without running when the limit and KILL_S do not fit in what is left of the budget (the
# stage is then recorded as SKIP).
run_stage() {
  local id=$1 name=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START)))
  LIMIT=${LIMITS[$id]}
  if ((LIMIT + KILL_S > left)); then
    record "$id" "$name" SKIP "time budget: needs ${LIMIT}s + ${KILL_S}s, ${left}s of ${BUDGET}s left" 0
    return 1
  fi
  local t0=$SECONDS tmp
  tmp=$(mktemp)
  echo "===== stage $id $name (timeout ${LIMIT}s): $*" >>"$LOG"
  timeout -k "$KILL_S" "$LIMIT" "$@" >"$tmp" 2>&1
  RC=$?
  SECS=$((SECONDS - t0))
  cat "$tmp" >>"$LOG"
  TAIL=$(tail -n 12 "$tmp" | cut -c1-300)
  rm -f "$tmp"
  return 0
}

# fail_reason WHAT: the reason for a failed run_stage.
fail_reason() { echo "$1, exit $RC"; }

# finish ID NAME STATUS REASON: record; a FAIL of a stage that its limit stopped is a TIMEOUT, whose
# reason is the limit and the stage's last line. On FAIL or TIMEOUT, show the stage's last lines.
finish() {
  local status=$3 reason=$4
  if [[ "$status" == FAIL ]] && ((RC == 124 || RC == 137)); then
    status=TIMEOUT
    local last
    last=$(grep -v '^[[:space:]]*$' <<<"$TAIL" | tail -n 1 | cut -c1-160)
    reason="stopped at its ${LIMIT}s limit; last line: ${last:-(none: no output yet)}"
  fi
  record "$1" "$2" "$status" "$reason" "$SECS"
  if [[ "$status" == FAIL || "$status" == TIMEOUT ]]; then
    sed 's/^/    | /' <<<"$TAIL"
  fi
}

# json_get FILE EXPR: a Python expression over the JSON in `d` (empty output when the file is missing).
json_get() {
  "$PY" -c 'import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null
}

say "device mode $DEVICE, stages:$STAGES budget ${BUDGET}s, outputs in $OUT"

# ---- a: probe ------------------------------------------------------------------------------------
if selected a; then
  rm -f "$OUT/probe.json"
  if run_stage a probe "$PY" benchmarks/gpu_smoke/probe.py --json "$OUT/probe.json" --label image --device "$DEVICE"; then
    line=$(grep '^probe image:' <<<"$TAIL" | head -1)
    if ((RC == 0)); then
      finish a probe PASS "${line#probe image: }"
    else
      [[ "$TAIL" == *"torch sees no CUDA device"* ]] && NO_CUDA="torch sees no CUDA device (stage a)"
      finish a probe FAIL "$(fail_reason "${line:-the probe failed}")"
    fi
  fi
else
  record a probe SKIP "not selected" 0
fi

# ---- w: carry ------------------------------------------------------------------------------------
if selected w; then
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  shopt -u nullglob
  SECS=0
  what="no wheels in $WHEELS/ (bash benchmarks/gpu_smoke_wheels.sh makes .whl/)"
  if ((${#wheels[@]})); then
    what="${#wheels[@]} wheels into $SITE"
    rm -rf "$SITE"
    if run_stage w carry "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" "${wheels[@]}"; then
      if ((RC != 0)); then
        NO_HOST="the wheels did not install (stage w)"
        finish w carry FAIL "$(fail_reason "pip install of ${#wheels[@]} wheels into $SITE failed")"
      fi
      export PYTHONPATH="$ROOT:$SITE${PYTHONPATH#"$ROOT"}"
    fi
  fi
  if [[ -z "$NO_HOST" ]]; then
    # after the install: a stand-in only where no ray / vllm imports (or GPU_SMOKE_STAND_INS=force)
    for mod in ray vllm; do
      if [[ "$STAND_INS" == force ]] || ! "$PY" -c "import $mod" >/dev/null 2>&1; then
        export PYTHONPATH="$ROOT/benchmarks/gpu_smoke/${mod}_stub:$PYTHONPATH"
      fi
    done
    SECS_INSTALL=$SECS
    # (no --device: a missing GPU is stage a's finding; here only the host imports count)
    if run_stage w carry "$PY" benchmarks/gpu_smoke/probe.py --json "$OUT/probe.json" --label smoke --host; then
      SECS=$((SECS + SECS_INSTALL))
      stubs=$(json_get "$OUT/probe.json" "' '.join(m for m in ('ray', 'vllm') if d['smoke']['modules'][m].get('stand_in'))")
      what="$what; stand-ins: ${stubs:-none}"
      if ((RC == 0)); then
        finish w carry PASS "$what"
      else
        NO_HOST="the actor path does not import (stage w)"
        problem=$(grep -m1 'PROBLEM' <<<"$TAIL" | sed 's/^probe smoke: PROBLEM //')
        finish w carry FAIL "$(fail_reason "$what; ${problem:-the host probe failed}")"
      fi
    fi
  fi
else
  record w carry SKIP "not selected" 0
fi

# stages that need CUDA (in cuda mode) or the host
needs() {  # id name [host]: prints a SKIP reason when the stage cannot run, else nothing
  if [[ -n "$NO_CUDA" ]]; then echo "$NO_CUDA"; return; fi
  if [[ "${3:-}" == host && -n "$NO_HOST" ]]; then echo "needs OpenRLHF + DeepSpeed: $NO_HOST"; fi
}

# ---- b: device discipline ------------------------------------------------------------------------
if ! selected b; then
  record b discipline SKIP "not selected" 0
elif [[ ! -f "$DISCIPLINE_TEST" ]]; then
  record b discipline SKIP "$DISCIPLINE_TEST not found: no device-discipline tests to run" 0
elif why=$(needs b discipline host) && [[ -n "$why" ]]; then
  record b discipline SKIP "$why" 0
else
  if [[ "$DEVICE" == cuda ]]; then
    env_b=(env DPPO_SECOND_DEVICE=cuda DS_ACCELERATOR=cuda)
    where="on the GPU (DPPO_SECOND_DEVICE=cuda)"
  else
    env_b=(env -u DPPO_SECOND_DEVICE)
    where="on the stand-in second device (CPU)"
  fi
  if run_stage b discipline "${env_b[@]}" "$PY" -m pytest -q -p no:cacheprovider -rs "$DISCIPLINE_TEST"; then
    counts=$(grep -E '[0-9]+ (passed|failed|error|skipped)' <<<"$TAIL" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
    if ((RC == 0)) && [[ "$counts" == *passed* && "$counts" != *skipped* ]]; then
      finish b discipline PASS "$counts $where"
    elif ((RC == 0)); then
      finish b discipline FAIL "$counts $where: a skip is not a pass"
    else
      finish b discipline FAIL "$(fail_reason "${counts:-pytest failed} $where")"
    fi
  fi
fi

# ---- c: packing numerics -------------------------------------------------------------------------
if ! selected c; then
  record c packing SKIP "not selected" 0
elif why=$(needs c packing) && [[ -n "$why" ]]; then
  record c packing SKIP "$why" 0
else
  if [[ "$DEVICE" == cuda ]]; then
    args_c=(--size qwen3-0.6b --device cuda --prompts 8 --warmup 1 --repeats 2 --fractions 1.0 0.5)
  else
    args_c=(--size tiny --device cpu --threads 2 --prompts 4 --max-response 64 --warmup 1 --repeats 1
      --fractions 1.0 0.5)
  fi
  rm -f "$OUT/gpu_actor.json"
  if run_stage c packing "$PY" benchmarks/gpu_actor.py "${args_c[@]}" --json "$OUT/gpu_actor.json"; then
    check=$(json_get "$OUT/gpu_actor.json" "'%s max|dlogp| packed %.3g, control %.3g, %s' % ('ok' if d['check']['packed_ok'] else 'NOT OK', d['check']['packed_max_abs_logp_diff'], d['check']['control_max_abs_logp_diff'], d['env']['attn'])")
    if ((RC == 0)) && [[ "$check" == ok* ]]; then
      finish c packing PASS "packed == padded: ${check#ok }"
    elif ((RC == 0)); then
      finish c packing FAIL "packed != padded: ${check:-no check in gpu_actor.json}"
    else
      finish c packing FAIL "$(fail_reason "gpu_actor.py failed")"
    fi
  fi
fi

# ---- d, e: the actor path ------------------------------------------------------------------------
actor_stage() {  # id name json [extra args]
  local id=$1 name=$2 json=$3
  shift 3
  if [[ "$DEVICE" == cuda ]]; then
    args_d=(--device cuda --size qwen3-0.6b "$@")
  else
    args_d=(--device cpu --size tiny "$@")
  fi
  rm -f "$OUT/$json"
  run_stage "$id" "$name" "$PY" benchmarks/gpu_smoke_actor.py "${args_d[@]}" --json "$OUT/$json" || return
  local arms failed
  arms=$(json_get "$OUT/$json" "', '.join(n + (' ok' if a['ok'] else ' FAILED ' + ','.join(k for k, v in a['checks'].items() if not v)) for n, a in d.get('arms', {}).items())")
  failed=$(json_get "$OUT/$json" "'%s in %s' % (d['error'], d['failed_phase']) if d.get('error') else ''")
  local extra
  extra=$(json_get "$OUT/$json" "'init %.0fs%s' % (d['timings'].get('init_s', 0), '; FusedAdam built in %.0fs' % d['env']['fused_adam_build_s'] if d.get('env', {}).get('fused_adam_build_s') else '')")
  if ((RC == 0)) && [[ -n "$arms" && "$arms" != *FAILED* ]]; then
    finish "$id" "$name" PASS "$arms; $extra"
  elif [[ -n "$failed" ]]; then
    finish "$id" "$name" FAIL "$(fail_reason "$failed")"
  else
    finish "$id" "$name" FAIL "$(fail_reason "${arms:-gpu_smoke_actor.py failed}")"
  fi
}

if ! selected d; then
  record d actor SKIP "not selected" 0
elif why=$(needs d actor host) && [[ -n "$why" ]]; then
  record d actor SKIP "$why" 0
else
  actor_stage d actor actor.json
fi

if ! selected e; then
  record e fused_adam SKIP "not selected" 0
elif [[ "$DEVICE" != cuda ]]; then
  record e fused_adam SKIP "needs CUDA: FusedAdam's CUDA kernel, JIT-built with nvcc" 0
elif why=$(needs e fused_adam host) && [[ -n "$why" ]]; then
  record e fused_adam SKIP "$why" 0
elif ! command -v nvcc >/dev/null || ! command -v ninja >/dev/null; then
  record e fused_adam SKIP "no nvcc or ninja here: DeepSpeed cannot build FusedAdam" 0
else
  actor_stage e fused_adam actor_fused.json --layers 2 --optimizer fused --arms dppo
fi

# ---- summary -------------------------------------------------------------------------------------
status=PASS
line=""
for r in "${RESULTS[@]}"; do
  IFS=$'\t' read -r id _ st _ _ <<<"$r"
  line+=" $id $st,"
  [[ "$st" == FAIL ]] && status=FAIL
  [[ "$st" == TIMEOUT && "$status" != FAIL ]] && status=TIMEOUT
done
printf '%s\n' "${RESULTS[@]}" | "$PY" -c '
import json, sys
stages = [dict(zip(("id", "name", "status", "reason", "seconds"), l.rstrip("\n").split("\t", 4))) for l in sys.stdin]
for s in stages:
    s["seconds"] = int(s["seconds"])
json.dump({"device": sys.argv[1], "status": sys.argv[2], "budget_s": int(sys.argv[3]),
           "elapsed_s": int(sys.argv[4]), "stages": stages}, open(sys.argv[5], "w"), indent=1)
' "$DEVICE" "$status" "$BUDGET" "$((SECONDS - START))" "$OUT/summary.json" || say "could not write summary.json"
say "summary:${line%,} -> $status in $((SECONDS - START))s (budget ${BUDGET}s); $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
case "$status" in PASS) exit 0 ;; TIMEOUT) exit 3 ;; *) exit 1 ;; esac
