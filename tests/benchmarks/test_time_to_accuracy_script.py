"""benchmarks/time_to_accuracy.sh runs any task and arm set: its runs' commands, read with PRINT_CMD=1
(nothing is built or run)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "time_to_accuracy.sh")


def run(print_cmd: bool = True, **env: str) -> subprocess.CompletedProcess:
    """The script under a clean environment: PRINT_CMD=1 (nothing is built or run) unless print_cmd=False."""
    full = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PRINT_CMD",
            "CONTROLS",
            "FLAGS",
            "POOL",
            "LOCK",
            "TASK",
            "SEEDS",
            "ARMS",
            "OUT",
            "STEPS",
            "EPISODE_STEPS",
            "SCHEDULE_STEPS",
            "TINY",
            "PRECISION",
            "OPENRLHF_DPPO_CPU_PRECISION",
        )  # fmt: skip
    }
    full.update(PYTHON="python", PRECISION="bf16")  # auto would ask torch
    if print_cmd:
        full["PRINT_CMD"] = "1"
    full.update(env)
    return subprocess.run(["bash", SCRIPT], env=full, capture_output=True, text=True)


PENDING = "after "  # a -budget arm whose DPPO run is not there yet: no command, what it will read


def commands(pending: bool = False, **env: str) -> list[tuple[str, str, list[str]]]:
    """(arm, seed, command) per run, in the order the script would run them; ``pending``: also the
    -budget arms whose batch is not known yet, with the command [] (left out otherwise)."""
    res = run(**env)
    assert res.returncode == 0, res.stderr
    out = []
    for line in res.stdout.splitlines():
        head, cmd = line.split(": ", 1)
        _, arm, _, seed = head.split()
        if cmd.startswith(PENDING):
            assert arm.endswith("-budget"), line
            if pending:
                out.append((arm, seed, []))
            continue
        out.append((arm, seed, shlex.split(cmd)))
    return out


def value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_every_arm_of_every_seed_runs_interleaved_on_the_chosen_task():
    runs = commands(pending=True, TASK="countdown", SEEDS="1 2", ARMS="grpo zero-share shrink-unseen df")
    # each DPPO arm is followed by its two equal-cost controls
    arms = (
        "grpo",
        "zero-share",
        "zero-share-uniform",
        "zero-share-budget",
        "shrink-unseen",
        "shrink-unseen-uniform",
        "shrink-unseen-budget",
        "df",
    )
    assert [(arm, seed) for arm, seed, _ in runs] == [(arm, seed) for seed in ("1", "2") for arm in arms]
    for arm, seed, cmd in runs:
        if not cmd:  # a -budget arm: its batch is read from its DPPO run, which has not run
            continue
        assert value(cmd, "--reward.remote_url") == "openrlhf_dppo/rewards/countdown.py"
        assert value(cmd, "--eval.dataset") == ".cache/tiny-countdown/data/eval.jsonl"
        assert value(cmd, "--ckpt.output_dir") == f"runs/tta_countdown/{arm}_s{seed}"
        assert value(cmd, "--train.seed") == seed
        assert value(cmd, "--dppo.method") == ("dppo" if arm not in ("grpo", "df") else "grpo")
        if arm not in ("grpo", "df"):
            assert value(cmd, "--dppo.prompt_prune_rate") == "0.5"
            if arm.startswith("shrink-unseen"):
                assert value(cmd, "--dppo.prompt_rate_control") == "fixed"
            else:  # zero-share: the default rate control
                assert "--dppo.prompt_rate_control" not in cmd
        assert ("--algo.dynamic_filtering_enable" in cmd) == (arm == "df")


def test_the_default_arms_and_the_first_task():
    assert [arm for arm, _, _ in commands(pending=True, SEEDS="1")] == [
        "grpo", "zero-share", "zero-share-uniform", "zero-share-budget", "df",
    ]  # fmt: skip
    (arm, seed, cmd), *_ = commands(SEEDS="3", ARMS="grpo")
    assert (arm, seed) == ("grpo", "3")
    assert value(cmd, "--reward.remote_url") == "openrlhf_dppo/rewards/arithmetic.py"
    assert value(cmd, "--ckpt.output_dir") == "runs/tta/grpo_s3"


def test_an_unknown_task_or_arm_is_refused_before_any_run():
    res = run(TASK="sudoku")
    assert res.returncode == 2 and "TASK must be addition or countdown, got 'sudoku'" in res.stderr
    res = run(ARMS="grpo dapo")
    assert res.returncode == 2 and "unknown arm 'dapo'" in res.stderr and res.stdout == ""


def test_a_run_the_training_script_refuses_stops_the_benchmark():
    res = run(TASK="countdown", SEEDS="1", ARMS="grpo", PRECISION="fp16")  # not a CPU precision
    assert res.returncode != 0 and "[tta] grpo seed 1:" not in res.stdout, res.stdout


def test_an_arm_can_have_its_own_step_count():
    runs = commands(SEEDS="1", ARMS="grpo zero-share:300 shrink-unseen:200", STEPS="120")
    assert [(arm, value(cmd, "--dppo.max_steps")) for arm, _, cmd in runs] == [
        ("grpo", "120"),
        ("zero-share", "300"),
        ("zero-share-uniform", "300"),  # a control runs its DPPO arm's steps
        ("shrink-unseen", "200"),
        ("shrink-unseen-uniform", "200"),
    ]
    assert [value(cmd, "--ckpt.output_dir") for _, _, cmd in runs] == [
        "runs/tta/grpo_s1",
        "runs/tta/zero-share_s1",
        "runs/tta/zero-share-uniform_s1",
        "runs/tta/shrink-unseen_s1",
        "runs/tta/shrink-unseen-uniform_s1",
    ]
    assert len({value(cmd, "--train.num_episodes") for _, _, cmd in runs}) == 1  # sized for the longest arm
    res = run(ARMS="grpo zero-share:lots")
    assert res.returncode == 2 and "arm 'zero-share:lots'" in res.stderr and res.stdout == ""


def test_one_lr_schedule_for_every_arm_lets_a_slow_arm_be_cut_short():
    runs = commands(SEEDS="1", ARMS="zero-share:300 df:100", SCHEDULE_STEPS="300")
    assert [
        (arm, value(cmd, "--dppo.max_steps"), value(cmd, "--dppo.schedule_steps")) for arm, _, cmd in runs
    ] == [
        ("zero-share", "300", "300"),
        ("zero-share-uniform", "300", "300"),
        ("df", "100", "300"),
    ]
    unset = commands(SEEDS="1", ARMS="zero-share:300 df:100")  # each run's own steps, as before
    assert [value(cmd, "--dppo.schedule_steps") for _, _, cmd in unset] == ["300", "300", "100"]
    res = run(ARMS="zero-share:300 df:100", SCHEDULE_STEPS="200")
    assert res.returncode == 2 and res.stdout == ""
    assert "SCHEDULE_STEPS must be a step count >= the longest arm's (300), got '200'" in res.stderr


@pytest.mark.parametrize(
    "arms",
    [
        "grpo shrink",
        "grpo refill",
        "grpo refill-unseen",
        "grpo zero-share-sqrt",
        "grpo zero-share-sqrt-uniform",
    ],
)
def test_an_arm_whose_flags_were_removed_is_refused_before_any_run(arms):
    res = run(SEEDS="1", ARMS=arms)
    bad = arms.split()[1]
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert f"arm '{bad}' ran flags that were removed" in res.stderr and "tag laboratory-v1" in res.stderr


def test_the_zero_share_arm_is_the_ro0_arm_under_the_default_rate_control():
    runs = dict((arm, cmd) for arm, _, cmd in commands(SEEDS="1", ARMS="shrink-unseen-ro0 zero-share"))
    zs, ro0 = runs["zero-share"], runs["shrink-unseen-ro0"]
    assert value(ro0, "--dppo.prompt_rate_control") == "fixed" and "--dppo.prompt_rate_control" not in zs
    for flag in ("--dppo.prompt_prune_rate", "--dppo.completion_prune_rate", "--rollout.batch_size",
                 "--train.seed"):  # fmt: skip
        assert value(zs, flag) == value(ro0, flag)
    assert value(zs, "--ckpt.output_dir") == "runs/tta/zero-share_s1"


def test_the_ro0_arm_is_shrink_unseen_without_completion_pruning():
    runs = dict((arm, cmd) for arm, _, cmd in commands(SEEDS="1", ARMS="shrink-unseen shrink-unseen-ro0"))
    ro0, base = runs["shrink-unseen-ro0"], runs["shrink-unseen"]
    assert value(ro0, "--dppo.completion_prune_rate") == "0"
    assert value(base, "--dppo.completion_prune_rate") == "0.5"
    for flag in ("--dppo.prompt_prune_rate", "--dppo.prompt_rate_control", "--rollout.batch_size"):
        assert value(ro0, flag) == value(base, flag)
    assert ro0.count("--dppo.completion_prune_rate") == 1  # set once, through train_tiny_cpu.sh's R_O


def test_the_half_batch_control_is_grpo_with_half_the_prompts():
    for env, drawn in (({}, 64), ({"TASK": "countdown", "PROMPTS": "32"}, 32)):
        runs = dict((arm, cmd) for arm, _, cmd in commands(SEEDS="2", ARMS="grpo grpo-half", **env))
        half, grpo = runs["grpo-half"], runs["grpo"]
        assert value(grpo, "--rollout.batch_size") == str(drawn)
        assert value(half, "--rollout.batch_size") == str(drawn // 2)
        assert value(half, "--train.batch_size") == str(drawn // 2 * 8)
        assert value(half, "--dppo.method") == "grpo" and value(half, "--train.seed") == "2"
        assert value(half, "--actor.adam.lr") == value(grpo, "--actor.adam.lr")


def test_the_half_batch_control_refuses_a_batch_it_cannot_halve_before_any_run():
    res = run(ARMS="grpo grpo-half", PROMPTS="1")
    assert res.returncode == 2 and "needs PROMPTS >= 2" in res.stderr and res.stdout == ""


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the venv's python: answers the precision query, records each training run's directory,
# (FAKE_STOP=1) asks the sitting to stop from inside its first run, as a person would, and writes the
# closing compare's report.md as the sitting's FAKE_SITTING
case "$2" in
  openrlhf_dppo.precision) echo bf16 ;;
  openrlhf_dppo.report.controls) echo "${FAKE_BUDGET:-}" ;;  # a -budget arm's PROMPTS
  openrlhf_dppo.cli.train_dppo_ray)
    while [ $# -gt 0 ]; do
      if [ "$1" = --ckpt.output_dir ]; then dir=$2; fi
      if [ "$1" = --rollout.batch_size ]; then batch=$2; fi
      shift
    done
    echo "$dir" >> "$FAKE_LOG"
    echo "$(basename "$dir") $batch" >> "$FAKE_LOG.batch"
    if [ "${FAKE_STOP:-0}" = 1 ]; then touch "$OUT_ROOT/STOP"; fi ;;
  openrlhf_dppo.cli.main)
    echo "$@" > "$FAKE_LOG.compare"
    while [ $# -gt 0 ]; do if [ "$1" = --out ]; then dir=$2; fi; shift; done
    mkdir -p "$dir" && echo "${FAKE_SITTING:-}" > "$dir/report.md" ;;
esac
exit 0
"""


def sitting(
    tmp_path,
    stop: bool,
    stale_stop: bool = False,
    seeds: str = "1 2 3",
    name: str = "",
    arms: str = "grpo shrink-unseen-ro0",
    controls: str = "0",
    budget: str = "",
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Runs the script's real loop over the seeds x 2 arms with a stand-in python (no training); a later
    call with the same tmp_path extends the same OUT. ``controls``: CONTROLS (0: the arms as named);
    ``budget``: what the stand-in answers for a -budget arm's PROMPTS."""
    tiny, out, calls = tmp_path / "tiny", tmp_path / "out", tmp_path / "calls.log"
    (tiny / "data").mkdir(parents=True, exist_ok=True)
    (tiny / "data" / "train.jsonl").write_text("{}\n" * 2000)
    out.mkdir(exist_ok=True)
    calls.write_text("")
    if stale_stop:
        (out / "STOP").touch()
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    res = run(
        print_cmd=False, PYTHON=str(fake), TINY=str(tiny), OUT=str(out), OUT_ROOT=str(out), FAKE_LOG=str(calls),
        FAKE_STOP="1" if stop else "0", SEEDS=seeds, ARMS=arms, FAKE_SITTING=name, CONTROLS=controls,
        FAKE_BUDGET=budget,
    )  # fmt: skip
    return res, calls.read_text().split()


def test_a_stop_file_ends_the_sitting_after_the_seed_in_progress(tmp_path):
    res, runs = sitting(tmp_path, stop=True)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    # the STOP came during seed 1's first arm: seed 1's second arm still runs, seed 2 never starts
    assert runs == [str(out / "grpo_s1"), str(out / "shrink-unseen-ro0_s1")]
    assert f"{out}/STOP found: no run of seed 2 or later" in res.stdout
    assert not (out / "STOP").exists()


def test_a_stop_file_left_from_an_earlier_sitting_does_not_stop_a_new_one(tmp_path):
    res, runs = sitting(tmp_path, stop=False, stale_stop=True)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    assert runs == [
        str(out / f"{arm}_s{seed}") for seed in (1, 2, 3) for arm in ("grpo", "shrink-unseen-ro0")
    ]
    assert "found" not in res.stdout


def test_a_sitting_extended_with_new_seeds_keeps_the_earlier_report(tmp_path):
    first, _ = sitting(tmp_path, stop=False, name="seeds 1-3")
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out"
    assert (out / "report" / "report.md").read_text() == "seeds 1-3\n"
    assert "kept as" not in first.stdout
    for n, (seeds, name) in enumerate((("4 5", "seeds 1-5"), ("6", "seeds 1-6")), start=1):
        res, runs = sitting(tmp_path, stop=False, seeds=seeds, name=name)
        assert res.returncode == 0, res.stderr
        assert runs == [
            str(out / f"{arm}_s{s}") for s in seeds.split() for arm in ("grpo", "shrink-unseen-ro0")
        ]
        assert f"the earlier {out}/report kept as {out}/report.{n}" in res.stdout
        assert (out / "report" / "report.md").read_text() == name + "\n"
    assert (out / "report.1" / "report.md").read_text() == "seeds 1-3\n"
    assert (out / "report.2" / "report.md").read_text() == "seeds 1-5\n"
    assert not (out / "report.3").exists()


def test_without_a_grpo_arm_the_printed_commands_keep_an_earlier_report(tmp_path):
    out = tmp_path / "out"
    compare_to = f"--baseline grpo --out {out}/report"
    res, runs = sitting(tmp_path, stop=False, seeds="1", arms="zero-share")
    assert res.returncode == 0, res.stderr
    assert runs == [str(out / "zero-share_s1")] and "no grpo arm in ARMS" in res.stdout
    assert res.stdout.rstrip().endswith(compare_to) and "mv " not in res.stdout  # nothing there to keep
    assert not (out / "report").exists()  # the script compares nothing itself
    (out / "report").mkdir()
    (out / "report.1").mkdir()
    res, _ = sitting(tmp_path, stop=False, seeds="2", arms="zero-share")
    assert res.returncode == 0, res.stderr
    mv, compare = res.stdout.strip().splitlines()[-2:]
    assert mv.split("#")[0].split() == ["mv", f"{out}/report", f"{out}/report.2"]  # the sitting's own naming
    assert compare.endswith(compare_to)
    assert (out / "report").is_dir() and not (out / "report.2").exists()  # printed, not done


def test_a_dppo_arms_uniform_control_is_its_command_plus_the_uniform_prompt_policy():
    runs = {arm: cmd for arm, _, cmd in commands(SEEDS="2", ARMS="grpo zero-share shrink-unseen-ro0:200")}
    assert set(runs) == {
        "grpo",
        "zero-share",
        "zero-share-uniform",
        "shrink-unseen-ro0",
        "shrink-unseen-ro0-uniform",
    }
    for arm in ("zero-share", "shrink-unseen-ro0"):
        own, uniform = runs[arm], runs[f"{arm}-uniform"]
        assert value(uniform, "--ckpt.output_dir") == f"runs/tta/{arm}-uniform_s2"
        renamed = [w.replace(f"/{arm}_s2", f"/{arm}-uniform_s2") for w in own]  # its run directory's paths
        assert uniform == renamed + ["--dppo.prompt_policy", "uniform"]
    assert "--dppo.prompt_policy" not in runs["grpo"] + runs["zero-share"]


def test_the_budget_control_is_grpo_at_the_rounded_mean_of_its_dppo_runs_rolled_out_prompts(tmp_path):
    out = tmp_path / "out"
    for seed, rolled_out in ((1, [20, 21, 21, 21]), (2, [30, 31])):  # 20.75 -> 21, 30.5 -> 31 (half up)
        rundir = out / f"zero-share_s{seed}"
        rundir.mkdir(parents=True)
        (rundir / "run_config.json").write_text(json.dumps({"args": {}, "algo": "dppo"}))
        lines = [{"kind": "train", "step": i + 1, "prompts/rolled_out": n} for i, n in enumerate(rolled_out)]
        (rundir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = dict(PYTHON=sys.executable, PYTHONPATH=ROOT, OUT=str(out), SEEDS="1 2 3", ARMS="grpo zero-share")
    runs = commands(pending=True, **env)
    budget = [(seed, cmd) for arm, seed, cmd in runs if arm == "zero-share-budget"]
    assert [seed for seed, _ in budget] == ["1", "2", "3"]
    (_, one), (_, two), (_, three) = budget
    assert value(one, "--rollout.batch_size") == "21" and value(one, "--train.batch_size") == str(21 * 8)
    assert value(two, "--rollout.batch_size") == "31" and three == []  # seed 3's DPPO run is not there yet
    grpo = next(cmd for arm, seed, cmd in runs if (arm, seed) == ("grpo", "1"))
    assert value(one, "--dppo.method") == "grpo" and value(one, "--dppo.max_steps") == value(
        grpo, "--dppo.max_steps"
    )
    assert value(one, "--actor.adam.lr") == value(grpo, "--actor.adam.lr")
    assert value(one, "--data.prompt_dataset") == value(grpo, "--data.prompt_dataset")  # one pool
    (out / "zero-share_s3").mkdir()  # a run that logged no step: its budget is unknown, nothing runs
    (out / "zero-share_s3" / "run_config.json").write_text("{}")
    (out / "zero-share_s3" / "metrics.jsonl").write_text("")
    res = run(**env)
    assert res.returncode != 0 and "prompts/rolled_out" in res.stderr


def test_a_sitting_runs_the_controls_interleaved_and_compares_them(tmp_path):
    res, runs = sitting(tmp_path, stop=False, seeds="1 2", arms="grpo zero-share", controls="1", budget="17")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out"
    arms = ("grpo", "zero-share", "zero-share-uniform", "zero-share-budget")
    assert runs == [str(out / f"{arm}_s{seed}") for seed in (1, 2) for arm in arms]
    batches = dict(line.split() for line in (tmp_path / "calls.log.batch").read_text().splitlines())
    assert batches["zero-share-budget_s1"] == batches["zero-share-budget_s2"] == "17"
    assert batches["grpo_s1"] == batches["zero-share-uniform_s2"] == "64"
    assert "zero-share seed 1 rolled out 17 prompts a step" in res.stdout
    compare = (tmp_path / "calls.log.compare").read_text().split()
    assert [compare[i + 1] for i, w in enumerate(compare) if w == "--arm"] == [
        f"{arm}={out}/{arm}_s*" for arm in arms
    ]


def test_a_budget_reading_that_is_not_a_prompt_count_stops_the_sitting(tmp_path):
    res, runs = sitting(tmp_path, stop=False, seeds="1", arms="grpo zero-share", controls="1", budget="")
    assert (
        res.returncode != 0 and "arm 'zero-share-budget' seed 1: expected a number of prompts" in res.stderr
    )
    assert runs == [
        str(tmp_path / "out" / f"{arm}_s1") for arm in ("grpo", "zero-share", "zero-share-uniform")
    ]


def test_controls_can_be_named_or_left_out_and_bad_ones_are_refused_before_any_run():
    named = commands(pending=True, SEEDS="1", ARMS="grpo zero-share-uniform zero-share zero-share-budget")
    assert [arm for arm, _, _ in named] == ["grpo", "zero-share-uniform", "zero-share", "zero-share-budget"]
    assert [arm for arm, _, _ in commands(pending=True, SEEDS="1", ARMS="grpo zero-share", CONTROLS="0")] == [
        "grpo", "zero-share",
    ]  # fmt: skip
    assert [arm for arm, _, _ in commands(pending=True, SEEDS="1", ARMS="grpo grpo-half df")] == [
        "grpo",
        "grpo-half",
        "df",
    ]  # fmt: skip: no DPPO arm, no control
    for env, message in (
        (
            {"ARMS": "grpo zero-share-budget zero-share"},
            "arm 'zero-share-budget' must come after 'zero-share'",
        ),
        (
            {"ARMS": "grpo df-uniform"},
            "unknown arm 'df-uniform' (the controls -uniform and -budget follow a DPPO arm",
        ),
        ({"ARMS": "grpo zero-share", "CONTROLS": "yes"}, "CONTROLS must be 1 or 0, got 'yes'"),
        ({"ARMS": "grpo zero-share", "POOL": "auto"}, "set POOL to a number of prompts"),
    ):
        res = run(**env)
        assert res.returncode == 2 and message in res.stderr and res.stdout == "", (env, res.stderr)
    assert commands(SEEDS="1", ARMS="grpo zero-share", POOL="auto", CONTROLS="0")  # no -budget arm: allowed


def test_an_async_arm_is_its_arm_under_the_async_trainer_and_its_budget_control_is_async_grpo():
    runs = {
        arm: cmd for arm, _, cmd in commands(pending=True, SEEDS="1", ARMS="grpo grpo-async zero-share-async")
    }
    assert list(runs) == ["grpo", "grpo-async", "zero-share-async", "zero-share-async-uniform",
                          "zero-share-async-budget"]  # fmt: skip
    sync = {arm: cmd for arm, _, cmd in commands(SEEDS="1", CONTROLS="0", ARMS="grpo zero-share")}
    for arm in ("grpo", "zero-share"):
        renamed = [w.replace(f"/{arm}_s1", f"/{arm}-async_s1") for w in sync[arm]]
        assert runs[f"{arm}-async"] == renamed + ["--train.async_enable"]
    assert runs["zero-share-async-uniform"][-3:] == [
        "--train.async_enable",
        "--dppo.prompt_policy",
        "uniform",
    ]
    assert "--train.async_enable" not in runs["grpo"] and runs["zero-share-async-budget"] == []  # read later
    res = run(SEEDS="1", ARMS="grpo grpo-async-async")
    assert res.returncode == 2 and "unknown arm 'grpo-async-async'" in res.stderr


def test_flags_reach_every_arm_and_control_alike(tmp_path):
    extra = ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip"]
    plain = {arm: cmd for arm, _, cmd in commands(SEEDS="1", ARMS="grpo zero-share-async")}
    out = str(tmp_path / "tta")
    ran = commands(SEEDS="1", ARMS="grpo zero-share-async", FLAGS=" ".join(extra))
    assert [arm for arm, _, _ in ran] == ["grpo", "zero-share-async", "zero-share-async-uniform"]
    for arm, _, cmd in ran:
        assert cmd == plain[arm] + extra, arm
    # the budget control, read from its DPPO arm's run, gets them too
    run_dir = tmp_path / "tta" / "zero-share-async_s1"
    run_dir.mkdir(parents=True)
    (run_dir / "run_config.json").write_text(json.dumps({"args": {}, "algo": "dppo"}))
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"kind": "train", "step": s, "prompts/rolled_out": 40}) + "\n" for s in (1, 2))
    )
    env = dict(PYTHON=sys.executable, PYTHONPATH=ROOT, OUT=out, SEEDS="1", ARMS="zero-share-async")
    budget = {arm: cmd for arm, _, cmd in commands(FLAGS=" ".join(extra), **env)}
    assert value(budget["zero-share-async-budget"], "--rollout.batch_size") == "40"
    assert budget["zero-share-async-budget"][-len(extra) - 1 :] == ["--train.async_enable", *extra]


def test_the_greso_arm_is_greso_with_dfs_dynamic_filtering_and_no_controls():
    runs = commands(pending=True, SEEDS="1", ARMS="grpo greso df", DF_RANGE="0.05 0.95")
    assert [arm for arm, _, _ in runs] == ["grpo", "greso", "df"]  # a biased peer: no -uniform / -budget
    greso, df = (cmd for arm, _, cmd in runs if arm in ("greso", "df"))
    assert value(greso, "--dppo.method") == "greso" and value(greso, "--dppo.seed") == "1"
    for cmd in (greso, df):
        assert "--algo.dynamic_filtering_enable" in cmd
        i = cmd.index("--algo.dynamic_filtering_range")
        assert cmd[i + 1 : i + 3] == ["0.05", "0.95"]
    res = run(SEEDS="1", ARMS="grpo greso-uniform")
    assert res.returncode == 2 and "unknown arm 'greso-uniform'" in res.stderr


def test_the_cppo_arm_is_cppo_at_half_the_completions_with_no_controls_and_no_async():
    runs = commands(pending=True, SEEDS="1 2", ARMS="grpo cppo", PROMPTS="16")
    assert [(arm, seed) for arm, seed, _ in runs] == [
        ("grpo", "1"),
        ("cppo", "1"),
        ("grpo", "2"),
        ("cppo", "2"),
    ]
    cppo, grpo = (
        next(cmd for arm, seed, cmd in runs if (arm, seed) == (name, "1")) for name in ("cppo", "grpo")
    )
    assert value(cppo, "--dppo.method") == "cppo" and value(cppo, "--dppo.completion_prune_rate") == "0.5"
    assert value(cppo, "--rollout.batch_size") == value(grpo, "--rollout.batch_size") == "16"  # it draws 32
    assert value(grpo, "--dppo.method") == "grpo"
    for arms in ("grpo cppo-uniform", "grpo cppo-budget", "grpo cppo-async", "grpo greso-async"):
        res = run(SEEDS="1", ARMS=arms)
        assert res.returncode == 2 and "unknown arm" in res.stderr, (arms, res.stderr)
