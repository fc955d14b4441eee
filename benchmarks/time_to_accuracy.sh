#!/usr/bin/env bash
# Time to held-out accuracy, several seeds per arm, on an embedded tiny task (TASK: addition, the default,
# or countdown; docs/REPORT.md). The arms, each run through examples/scripts/train_tiny_cpu.sh, which keeps
# every setting equal across arms but the algorithm flags (same packing, eval schedule, seed):
#   grpo     GRPO (--dppo.method grpo), the baseline
#   zero-share  DPPO at its defaults: the prompt prune rate follows the measured share of groups without
#            gradient (--dppo.prompt_rate_control zero-share; R_Q, 0.5, is only the first step's rate), no
#            completion pruning (R_O=0; completions with zero advantage are still dropped, exactly)
#   shrink-unseen  DPPO at a fixed r_q = r_o = 0.5 (--dppo.prompt_rate_control fixed; the names of the
#            fixed-rate arms are those of the sittings that ran them)
#   shrink-unseen-ro0  shrink-unseen without completion pruning (R_O=0: r_o = 0)
#   df       GRPO with OpenRLHF's dynamic filtering (DAPO dynamic sampling; the GRESO-style baseline)
#   greso    GRESO (--dppo.method greso) with df's dynamic filtering (DF_RANGE): a biased peer, with no
#            X-uniform / X-budget controls
#   cppo     CPPO (--dppo.method cppo --dppo.completion_prune_rate 0.5: int(PROMPTS / 0.5) prompts rolled
#            out a step, the top half of each group by |A| trained at weight 1): a biased peer, with no
#            X-uniform / X-budget controls; like greso, no X-async (the peers run on the sync trainer)
#   grpo-half  GRPO with half the prompts a step (PROMPTS / 2): the batch DPPO rolls out at r_q = 0.5, a
#            control for "is it only a smaller batch?" (compare names it a control, GRPO at DPPO's budget,
#            comparable: it differs in its batch by design)
#   X-async  arm X under OpenRLHF's asynchronous trainer (--train.async_enable: the next batch is generated
#            while the last one trains), e.g. grpo-async, zero-share-async (its -budget control is async GRPO)
# The equal-cost controls (docs/REPORT.md), for any DPPO arm X above:
#   X-uniform  X's flags plus --dppo.prompt_policy uniform (q = 1 - r for every prompt under the same rate
#            control): an arm that differs from X in the selection alone
#   X-budget   GRPO with X's budget: --rollout.batch_size (PROMPTS) = the round of the mean rolled-out
#            prompts per step (prompts/rolled_out) of X's run of the same seed, read when that run has
#            finished (python -m openrlhf_dppo.report.controls --budget RUN_DIR). Same seed, not all of
#            X's seeds: the runs stay interleaved, and each control spends what the run it controls spent
#            (its batch may differ by a prompt between seeds; compare matches it to X by the mean)
# Every sitting runs them: each DPPO arm in ARMS that is not a control is followed, in every seed, by its
# X-uniform and X-budget (with X's step count) unless ARMS names them itself (X-budget after X) or
# CONTROLS=0 (then compare's column "vs the same budget, chosen at random" says "no control run"). The
# recorded commands of sittings before the controls ran without them: CONTROLS=0 repeats them exactly.
# Arms whose flags were removed (shrink, refill, refill-unseen, X-sqrt) are refused: they are recoverable
# from tag laboratory-v1.
# The runs are interleaved (seed 1 of every arm, then seed 2, ...), so slow drift in the machine's load
# reaches every arm alike. Then `openrlhf-dppo compare` over all runs writes the report (mean and spread
# over seeds; training time = the sum of step times, start-up and evaluation excluded) to $OUT/report; a
# report already there (a sitting extended with new seeds) is first moved to $OUT/report.1 (.2, ...).
#
#   bash benchmarks/time_to_accuracy.sh                     # SEEDS="1 2 3", ARMS="grpo zero-share df",
#                                                           # each DPPO arm followed by its two controls
#   ARMS="grpo zero-share" bash benchmarks/time_to_accuracy.sh  # grpo zero-share zero-share-uniform
#                                                           # zero-share-budget, interleaved
#   SEEDS="1" STEPS=50 bash benchmarks/time_to_accuracy.sh  # a quick look
#   TASK=countdown ARMS="grpo shrink-unseen" bash benchmarks/time_to_accuracy.sh
#   ARMS="grpo zero-share:300 shrink-unseen:200" bash benchmarks/time_to_accuracy.sh  # per-arm step counts
#   PRINT_CMD=1 TASK=countdown bash benchmarks/time_to_accuracy.sh  # each run's command; nothing is run
#   SCHEDULE_STEPS=300 ARMS="zero-share:300 df:100" bash benchmarks/time_to_accuracy.sh  # df stopped at
#       step 100 of the 300-step lr schedule every arm follows (a slow arm cut short, the schedule kept)
#
# Environment: TASK (addition | countdown, train_tiny_cpu.sh's switch), SEEDS, ARMS (each `arm` or
# `arm:steps`, the second giving that arm its own step count, e.g. about GRPO's training time for an arm
# whose steps are shorter; runs go to <arm>_s<seed> either way; every arm's --train.num_episodes is sized
# for the longest arm, so that only --dppo.max_steps differs), STEPS (every other arm's; 150, as
# train_tiny_cpu.sh's default), OUT (runs/tta; countdown: runs/tta_countdown), DF_RANGE ("0.01 0.99":
# groups whose mean score is outside are dropped and replaced; countdown's score for dynamic filtering is
# the 0/1 solve indicator, see openrlhf_dppo/rewards/countdown.py), PYTHON (.venv/bin/python),
# CONTROLS (1: the controls above follow every DPPO arm; 0: none is added), FLAGS (train_dppo_ray flags
# added to every arm's command alike, split on spaces, e.g. "--algo.advantage.is_correction_level token"), LOCK (unset; when set, each run holds this flock(1) lock file, so other heavy work on a shared machine
# waits between runs, not during one), TINY (train_tiny_cpu.sh's task assets), and train_tiny_cpu.sh's
# other settings, passed on to every arm alike (PROMPTS but to X-budget and grpo-half; POOL must then be a
# number, not auto, so that every arm draws from one pool): PROMPTS, SAMPLES, LR (1e-3; countdown 3e-4), LR_SCHEDULER
# (constant; cosine_with_min_lr decays each run over its own step count, or over SCHEDULE_STEPS when set:
# then every arm follows one schedule, and SCHEDULE_STEPS must be >= every arm's steps), EVAL_STEPS.
# Without grpo in ARMS (re-running some arms next to an earlier baseline) the runs are made and the
# compare command printed (after a command that moves an earlier $OUT/report aside, as a sitting does).
# To end a sitting early with every arm on the same seeds: `touch $OUT/STOP`. The seed in progress runs
# its remaining arms, no further seed starts, and the runs made so far are compared. A STOP file left from
# an earlier sitting is removed when the script starts.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export TASK=${TASK:-addition}
case "$TASK" in
  addition) OUT=${OUT:-runs/tta} ;;
  countdown) OUT=${OUT:-runs/tta_countdown} ;;
  *) echo "TASK must be addition or countdown, got '$TASK'" >&2; exit 2 ;;
esac
SEEDS=${SEEDS:-1 2 3}
ARMS=${ARMS:-grpo zero-share df}
read -r -a DF_RANGE <<< "${DF_RANGE:-0.01 0.99}"
read -r -a COMMON_FLAGS <<< "${FLAGS:-}"  # every arm alike

arm_env() {  # arm -> "ALGO [VAR=value ...] extra-flags...": the VAR=value words are the run's environment
  case "$1" in
    grpo) echo "grpo" ;;
    grpo-half)
      if (( ${PROMPTS:-64} < 2 )); then  # 64: train_tiny_cpu.sh's default
        echo "arm 'grpo-half' needs PROMPTS >= 2 (it runs PROMPTS / 2 a step), got '${PROMPTS:-64}'" >&2; return 2
      fi
      echo "grpo PROMPTS=$(( ${PROMPTS:-64} / 2 ))" ;;
    zero-share) echo "dppo R_Q=0.5 R_O=0" ;;  # DPPO's defaults, written out
    shrink-unseen) echo "dppo R_Q=0.5 R_O=0.5 --dppo.prompt_rate_control fixed" ;;
    shrink-unseen-ro0) echo "dppo R_Q=0.5 R_O=0 --dppo.prompt_rate_control fixed" ;;
    df) echo "grpo --algo.dynamic_filtering_enable --algo.dynamic_filtering_range ${DF_RANGE[*]}" ;;
    greso) echo "greso --algo.dynamic_filtering_enable --algo.dynamic_filtering_range ${DF_RANGE[*]}" ;;
    cppo) echo "cppo R_O=0.5" ;;
    shrink|refill|refill-unseen|*-sqrt|*-sqrt-*)
      echo "arm '$1' ran flags that were removed (--dppo.prompt_batch, --dppo.unseen_prompts keep," \
        "--dppo.prompt_policy sqrt); it is recoverable from tag laboratory-v1" >&2; return 2 ;;
    *-uniform|*-budget)
      local base=${1%-*} words
      if ! words=$(arm_env "$base" 2> /dev/null) || [[ "$words" != dppo* ]] \
          || [[ "$1" == *-uniform && "$words" == *--dppo.prompt_policy* ]]; then
        echo "unknown arm '$1' (the controls -uniform and -budget follow a DPPO arm: zero-share," \
          "shrink-unseen, shrink-unseen-ro0)" >&2; return 2
      fi
      if [[ "$1" == *-uniform ]]; then echo "$words --dppo.prompt_policy uniform"
      elif [[ "$base" == *-async ]]; then echo "grpo --train.async_enable"  # an async arm's: async GRPO
      else echo "grpo"; fi ;;  # PROMPTS: X's budget, read after X's run (budget_prompts)
    *-async)
      local words
      if ! words=$(arm_env "${1%-async}" 2> /dev/null) || [[ "$words" == *--train.async_enable* ]]; then
        echo "unknown arm '$1' (X-async is arm X under OpenRLHF's asynchronous trainer)" >&2; return 2
      fi
      if [[ "$words" == cppo* || "$words" == greso* ]]; then
        echo "unknown arm '$1' (the peers cppo and greso run on the synchronous trainer only)" >&2; return 2
      fi
      echo "$words --train.async_enable" ;;
    *) echo "unknown arm '$1' (grpo, zero-share, shrink-unseen, shrink-unseen-ro0, df, greso, cppo, grpo-half, any of" \
         "them under the async trainer X-async, or a DPPO arm's control X-uniform, X-budget)" >&2; return 2 ;;
  esac
}
is_control() { [[ "$1" == *-uniform || "$1" == *-budget ]]; }
is_dppo() { [[ "$(arm_env "$1")" == dppo* ]]; }
budget_prompts() {  # -budget arm, seed -> its PROMPTS, from its DPPO arm's run of that seed
  local n
  n=$("$PY" -m openrlhf_dppo.report.controls --budget "$OUT/${1%-budget}_s$2")
  if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
    echo "arm '$1' seed $2: expected a number of prompts from $OUT/${1%-budget}_s$2, got '$n'" >&2; return 2
  fi
  echo "$n"
}

arm_name() { echo "${1%%:*}"; }
split_spec() {  # words of arm_env -> ARM_ENV (VAR=value words) and ARM_FLAGS (the flags)
  ARM_ENV=(); ARM_FLAGS=()
  local w
  for w in "$@"; do
    if [[ "$w" =~ ^[A-Z_]+= ]]; then ARM_ENV+=("$w"); else ARM_FLAGS+=("$w"); fi
  done
  ARM_FLAGS+=(${COMMON_FLAGS[@]+"${COMMON_FLAGS[@]}"})
}
STEPS=${STEPS:-150}
arm_steps() {  # "shrink:300" -> 300, "grpo" -> STEPS
  case "$1" in
    *:*) local n=${1#*:}
      if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
        echo "arm '$1': the step count after ':' must be a positive integer" >&2; return 2
      fi
      echo "$n" ;;
    *) echo "$STEPS" ;;
  esac
}
EPISODE_STEPS=0  # the longest arm's steps: every arm passes the same --train.num_episodes
for spec in $ARMS; do  # an unknown arm or a bad step count stops here, before any run
  arm_env "$(arm_name "$spec")" > /dev/null; n=$(arm_steps "$spec")
  if (( n > EPISODE_STEPS )); then EPISODE_STEPS=$n; fi
done
if ! [[ "${CONTROLS:-1}" =~ ^[01]$ ]]; then echo "CONTROLS must be 1 or 0, got '$CONTROLS'" >&2; exit 2; fi
NAMED=" "; for spec in $ARMS; do NAMED+="$(arm_name "$spec") "; done
LISTED=""  # ARMS with each DPPO arm's controls after it (CONTROLS=1), checked before any run
for spec in $ARMS; do
  arm=$(arm_name "$spec")
  if [[ "$arm" == *-budget && "$NAMED" == *" ${arm%-budget} "* && " $LISTED " != *" ${arm%-budget} "* \
        && " $LISTED " != *" ${arm%-budget}:"* ]]; then
    echo "arm '$arm' must come after '${arm%-budget}' in ARMS: it reads that arm's run of the same seed" >&2; exit 2
  fi
  LISTED+=" $spec"
  if [ "${CONTROLS:-1}" = 1 ] && ! is_control "$arm" && is_dppo "$arm"; then
    steps=${spec#"$arm"}  # ":300" or empty: a control runs X's steps
    for control in "$arm-uniform" "$arm-budget"; do
      if [[ "$NAMED" != *" $control "* && " $LISTED " != *" $control "* && " $LISTED " != *" $control:"* ]]; then
        LISTED+=" $control$steps"
      fi
    done
  fi
done
ARMS=${LISTED# }
if [[ " $ARMS" == *-budget* ]] && [ "${POOL:-}" = auto ]; then
  echo "POOL=auto sizes each run's pool by its own PROMPTS, so a -budget arm would draw from another pool;" \
    "set POOL to a number of prompts" >&2; exit 2
fi
if [ -n "${SCHEDULE_STEPS:-}" ] && { ! [[ "$SCHEDULE_STEPS" =~ ^[1-9][0-9]*$ ]] || (( SCHEDULE_STEPS < EPISODE_STEPS )); }; then
  echo "SCHEDULE_STEPS must be a step count >= the longest arm's ($EPISODE_STEPS), got '$SCHEDULE_STEPS'" >&2
  exit 2
fi
export EPISODE_STEPS
if [ "${PRINT_CMD:-0}" = 1 ]; then  # each run's training command (train_tiny_cpu.sh's PRINT_CMD)
  for seed in $SEEDS; do
    for arm_spec in $ARMS; do
      arm=$(arm_name "$arm_spec")
      read -r -a spec <<< "$(arm_env "$arm")"
      split_spec "${spec[@]:1}"
      if [[ "$arm" == *-budget ]]; then
        if ! [ -f "$OUT/${arm%-budget}_s$seed/metrics.jsonl" ]; then  # not run yet: its batch is unknown
          echo "[tta] $arm seed $seed: after ${arm%-budget} seed $seed, GRPO with PROMPTS = the round of its" \
            "mean rolled-out prompts per step (python -m openrlhf_dppo.report.controls --budget" \
            "$OUT/${arm%-budget}_s$seed)"
          continue
        fi
        prompts=$(budget_prompts "$arm" "$seed")  # set -e: a run it cannot read stops here
        ARM_ENV+=("PROMPTS=$prompts")
      fi
      cmd=$(env ${ARM_ENV[@]+"${ARM_ENV[@]}"} ALGO=${spec[0]} SEED=$seed OUT="$OUT/${arm}_s${seed}" PYTHON=$PY \
        STEPS=$(arm_steps "$arm_spec") bash examples/scripts/train_tiny_cpu.sh ${ARM_FLAGS[@]+"${ARM_FLAGS[@]}"})
      # set -e: a refused run stops here
      echo "[tta] $arm seed $seed: $cmd"
    done
  done
  exit 0
fi

mkdir -p "$OUT"
STOP_FILE="$OUT/STOP"
rm -f "$STOP_FILE"
for seed in $SEEDS; do
  if [ -e "$STOP_FILE" ]; then
    echo "[tta] $STOP_FILE found: no run of seed $seed or later; comparing the seeds that ran"
    rm -f "$STOP_FILE"
    break
  fi
  for arm_spec in $ARMS; do
    arm=$(arm_name "$arm_spec")
    read -r -a spec <<< "$(arm_env "$arm")"
    split_spec "${spec[@]:1}"
    run="$OUT/${arm}_s${seed}"
    if [ -f "$run/status.json" ] && grep -q '"finished"' "$run/status.json"; then
      echo "[tta] $run finished earlier: kept"; continue
    fi
    if [[ "$arm" == *-budget ]]; then
      prompts=$(budget_prompts "$arm" "$seed")  # set -e: a run without prompts/rolled_out stops here
      ARM_ENV+=("PROMPTS=$prompts")
      echo "[tta] ${arm%-budget} seed $seed rolled out $prompts prompts a step (rounded mean): $arm runs GRPO at $prompts"
    fi
    echo "[tta] $(date +%T) $TASK $arm seed $seed -> $run  (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    lock=()
    if [ -n "${LOCK:-}" ]; then lock=(flock "$LOCK"); fi
    env ${ARM_ENV[@]+"${ARM_ENV[@]}"} ALGO=${spec[0]} SEED=$seed OUT=$run PYTHON=$PY STEPS=$(arm_steps "$arm_spec") \
      ${lock[@]+"${lock[@]}"} bash examples/scripts/train_tiny_cpu.sh ${ARM_FLAGS[@]+"${ARM_FLAGS[@]}"}
  done
done

NAMES=""; for arm_spec in $ARMS; do NAMES+=" $(arm_name "$arm_spec")"; done
args=()
for arm in $NAMES; do args+=(--arm "$arm=$OUT/${arm}_s*"); done
REPORT="$OUT/report"
# where an earlier report is kept (an earlier sitting's, e.g. before this one added seeds): report.1, .2, ...
kept_name() { local n=1; while [ -e "$REPORT.$n" ]; do n=$((n + 1)); done; echo "$REPORT.$n"; }
if [[ "$NAMES " != *" grpo "* ]]; then  # e.g. ARMS="zero-share df" next to an earlier run's grpo arm
  echo "[tta] no grpo arm in ARMS: compare these runs with the baseline's yourself, e.g."
  if [ -e "$REPORT" ]; then echo "      mv $REPORT $(kept_name)    # keeps the earlier report"; fi
  quoted=""; for arm in $NAMES; do quoted+=" --arm '$arm=$OUT/${arm}_s*'"; done
  echo "      openrlhf-dppo compare --arm grpo='<runs>/grpo_s*'$quoted --baseline grpo --out $REPORT"
  exit 0
fi
if [ -e "$REPORT" ]; then
  kept=$(kept_name)
  mv "$REPORT" "$kept"
  echo "[tta] the earlier $REPORT kept as $kept; the new report compares every run of these arms in $OUT"
fi
"$PY" -m openrlhf_dppo.cli.main compare "${args[@]}" --baseline grpo --out "$REPORT"
