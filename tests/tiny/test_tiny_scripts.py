"""examples/scripts/train_tiny_cpu.sh and demo_tiny_cpu.sh: one recipe, two arms that differ only in the
DPPO flags. The training command is read with ``PRINT_CMD=1`` (nothing is built or run)."""

from __future__ import annotations

import math
import os
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "examples", "scripts")
DPPO_ONLY = {"--dppo.seed"}


def command(algo: str, **env: str) -> list[str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "STEPS",
            "SEED",
            "LR",
            "LR_SCHEDULER",
            "OUT",
            "TINY",
            "POOL",
            "TASK",
            "SCHEDULE_STEPS",
            "MODE",
            "R_Q",
            "R_O",
        )
    }
    full.update(ALGO=algo, PRINT_CMD="1", PYTHON="python", PRECISION="bf16")  # auto would ask torch
    full.update(env)
    out = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "train_tiny_cpu.sh")],
        env=full,
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(out.stdout)


def flags(cmd: list[str]) -> dict[str, list[str]]:
    """``--flag value...`` pairs of a command (a flag without value maps to [])."""
    out, key = {}, None
    for tok in cmd[3:]:  # python -m module
        if tok.startswith("--"):
            key = tok
            assert key not in out, f"{key} passed twice"
            out[key] = []
        else:
            out[key].append(tok)
    return out


def test_grpo_and_dppo_differ_only_in_the_dppo_flags():
    grpo, dppo = (flags(command(algo, OUT="runs/arm")) for algo in ("grpo", "dppo"))  # same OUT: same paths
    assert grpo.pop("--dppo.method") == ["grpo"] and dppo.pop("--dppo.method") == ["dppo"]
    assert {k: dppo.pop(k) for k in DPPO_ONLY} == {"--dppo.seed": ["1"]}  # DPPO's own defaults otherwise
    assert grpo == dppo


def test_the_rates_are_dppos_defaults_unless_set_and_mode_is_refused():
    assert "--dppo.prompt_prune_rate" not in flags(command("dppo"))  # DPPO's defaults
    f = flags(command("dppo", R_Q="0.5", R_O="0.5"))
    assert f["--dppo.prompt_prune_rate"] == ["0.5"] and f["--dppo.completion_prune_rate"] == ["0.5"]
    with pytest.raises(subprocess.CalledProcessError) as err:
        command("dppo", MODE="custom")  # the preset layer is gone: its values are the defaults
    assert err.value.returncode == 2 and "MODE is no longer read" in err.value.stderr


def test_both_arms_train_packed_and_share_the_eval_schedule():
    for algo in ("grpo", "dppo"):
        f = flags(command(algo))
        assert f["--train.dynamic_batch_enable"] == [] and f["--train.max_tokens_per_gpu"] == ["4096"]
        assert f["--eval.dataset"] == [".cache/tiny/data/eval.jsonl"]
        assert (f["--eval.steps"], f["--eval.temperature"], f["--eval.n_samples_per_prompt"]) == (
            ["10"],
            ["0"],
            ["1"],
        )


@pytest.mark.parametrize("steps", [1, 60, 300, 1000])
def test_steps_are_steps_and_enough_episodes_are_passed(steps):
    f = flags(command("grpo", STEPS=str(steps)))
    assert f["--dppo.max_steps"] == [str(steps)]
    prompts = int(f["--rollout.batch_size"][0])
    episodes = int(f["--train.num_episodes"][0])
    # dynamic filtering draws about 1.8 x PROMPTS per step: a run that ran out of episodes stopped early
    # (the benchmark's DF arm once stopped at 80 of 150 steps)
    assert episodes == math.ceil(4 * steps * prompts / 2000)
    assert episodes * 2000 >= 2 * steps * prompts


def test_seed_and_learning_rate_reach_the_command():
    f = flags(command("dppo", SEED="7", LR="3e-4", R_Q="0.3", R_O="0.7"))
    assert f["--train.seed"] == ["7"] and f["--dppo.seed"] == ["7"]
    assert f["--actor.adam.lr"] == ["3e-4"]
    assert flags(command("grpo", TASK="countdown", LR="1e-4"))["--actor.adam.lr"] == ["1e-4"]  # LR wins
    assert f["--dppo.prompt_prune_rate"] == ["0.3"] and f["--dppo.completion_prune_rate"] == ["0.7"]


def test_the_lr_schedule_is_constant_unless_asked_and_a_bad_one_is_refused_by_name():
    for algo in ("grpo", "dppo"):
        f = flags(command(algo))
        assert f["--actor.lr_scheduler"] == ["constant"] and f["--actor.lr_warmup_ratio"] == ["0"]
        cosine = flags(command(algo, LR_SCHEDULER="cosine_with_min_lr"))
        assert cosine["--actor.lr_scheduler"] == ["cosine_with_min_lr"]
        assert cosine["--actor.lr_warmup_ratio"] == ["0"]
    with pytest.raises(subprocess.CalledProcessError) as err:
        command("grpo", LR_SCHEDULER="linear")
    assert err.value.returncode == 2
    assert "LR_SCHEDULER must be constant or cosine_with_min_lr, got 'linear'" in err.value.stderr


def test_the_lr_schedule_spans_the_runs_steps_unless_schedule_steps_says_longer():
    assert flags(command("grpo", STEPS="40"))["--dppo.schedule_steps"] == ["40"]
    cut = flags(command("grpo", STEPS="40", SCHEDULE_STEPS="300"))
    assert cut["--dppo.max_steps"] == ["40"] and cut["--dppo.schedule_steps"] == ["300"]
    for bad in ("39", "lots"):
        with pytest.raises(subprocess.CalledProcessError) as err:
            command("grpo", STEPS="40", SCHEDULE_STEPS=bad)
        assert err.value.returncode == 2
        assert f"SCHEDULE_STEPS must be a step count >= STEPS (40), got '{bad}'" in err.value.stderr


def test_the_precision_reaches_the_command_and_a_bad_one_is_refused_by_name():
    assert flags(command("grpo", PRECISION="fp32"))["--ds.param_dtype"] == ["fp32"]
    assert flags(command("grpo"))["--ds.param_dtype"] == ["bf16"]
    with pytest.raises(subprocess.CalledProcessError) as err:
        command("grpo", PRECISION="fp64")
    assert err.value.returncode == 2
    assert "PRECISION='fp64': expected one of auto, bf16, fp32" in err.value.stderr


def test_an_unknown_algorithm_is_refused_by_name():
    env = dict(os.environ, ALGO="ppo", PRINT_CMD="1")
    res = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "train_tiny_cpu.sh")], env=env, capture_output=True, text=True
    )
    assert res.returncode == 2 and "ALGO must be grpo, dppo, greso or cppo, got 'ppo'" in res.stderr


def test_the_demo_builds_everything_before_the_first_run_and_runs_both_arms_alike():
    lines = open(os.path.join(SCRIPTS, "demo_tiny_cpu.sh")).read().splitlines()

    def first(text):
        return next(i for i, ln in enumerate(lines) if text in ln)

    runs = [ln for ln in lines if "train_tiny_cpu.sh" in ln and not ln.startswith("#")]
    assert runs == [
        'ALGO=grpo OUT="$RUNS/grpo" bash examples/scripts/train_tiny_cpu.sh',
        'ALGO=dppo OUT="$RUNS/dppo" bash examples/scripts/train_tiny_cpu.sh',
    ]
    first_run = first('ALGO=grpo OUT="$RUNS/grpo"')
    assert first("openrlhf_dppo.tiny.build") < first_run
    assert first("FusedAdamBuilder") < first_run and first("create_op_builder") < first_run
    assert first("openrlhf_dppo.tiny.progress summary") > first_run
    assert first("openrlhf_dppo.cli.main compare") > first_run


@pytest.mark.parametrize(
    "steps, pool, prompt_file",
    [
        ("150", "auto", "train.jsonl"),  # three epochs of the full pool or more: all of it
        ("94", "auto", "train.jsonl"),
        ("93", "auto", "train_1984.jsonl"),
        ("30", "auto", "train_640.jsonl"),  # a third of the 30 x 64 prompts drawn: epochs of 10 steps
        ("1", "auto", "train_64.jsonl"),  # never less than one batch
        ("30", "1000", "train_1000.jsonl"),
        ("30", "2000", "train.jsonl"),
    ],
)
def test_a_quick_look_trains_on_a_pool_small_enough_for_prompts_to_come_back(steps, pool, prompt_file):
    """A prompt has no history of its own until its second epoch, so a prompt score needs prompts that come
    back."""
    f = flags(command("dppo", STEPS=steps, POOL=pool))
    assert f["--data.prompt_dataset"] == [f".cache/tiny/data/{prompt_file}"]
    size = 2000 if prompt_file == "train.jsonl" else int(prompt_file[6:-6])
    assert f["--train.num_episodes"] == [str(math.ceil(4 * int(steps) * 64 / size))]
    if pool == "auto" and int(steps) > 3:
        assert int(steps) * 64 / size >= 3  # at least two epochs with a history to score the prompts


def test_the_default_pool_is_the_whole_training_split():
    assert flags(command("dppo", STEPS="30", POOL=""))["--data.prompt_dataset"] == [
        ".cache/tiny/data/train.jsonl"
    ]


@pytest.mark.parametrize("pool", ["10", "2001", "half"])
def test_a_pool_out_of_range_is_refused_by_name(pool):
    env = dict(os.environ, ALGO="dppo", PRINT_CMD="1", POOL=pool, PYTHON="python", PRECISION="bf16")
    res = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "train_tiny_cpu.sh")], env=env, capture_output=True, text=True
    )
    assert res.returncode == 2 and res.stderr.startswith(
        f"POOL must be auto or a number of prompts from 64 (one batch) to 2000, got '{pool}'"
    )


def test_the_demo_asks_for_the_quick_look_pool():
    text = open(os.path.join(SCRIPTS, "demo_tiny_cpu.sh")).read()
    assert 'export POOL="${POOL:-auto}"' in text


TASK_FLAGS = {  # what the TASK switch may change: the task's files, its lengths, lr, where the run goes
    "--actor.adam.lr": ["3e-4"],  # countdown: GRPO fell at 1e-3, climbed at 3e-4 (ARCHIVE.md)
    "--actor.model_name_or_path": [".cache/tiny-countdown/model"],
    "--data.prompt_dataset": [".cache/tiny-countdown/data/train.jsonl"],
    "--eval.dataset": [".cache/tiny-countdown/data/eval.jsonl"],
    "--reward.remote_url": ["openrlhf_dppo/rewards/countdown.py"],
    "--rollout.max_new_tokens": ["48"],
    "--data.max_len": ["64"],
    "--ckpt.output_dir": ["runs/tiny_cpu_countdown/dppo"],
    "--ckpt.path": ["runs/tiny_cpu_countdown/dppo/ckpt"],
}


def test_task_countdown_changes_only_the_tasks_files_lengths_lr_and_run_directory():
    from openrlhf_dppo.tiny import countdown

    default, addition, second = (
        flags(command("dppo", **env)) for env in ({}, {"TASK": "addition"}, {"TASK": "countdown"})
    )
    assert default == addition  # the first task stays the default
    assert addition["--reward.remote_url"] == ["openrlhf_dppo/rewards/arithmetic.py"]
    assert addition["--actor.adam.lr"] == ["1e-3"]
    assert {k: second.pop(k) for k in TASK_FLAGS} == TASK_FLAGS
    assert {k: addition.pop(k) for k in TASK_FLAGS} != TASK_FLAGS
    assert second == addition
    assert (countdown.MAX_NEW_TOKENS, countdown.MAX_LEN) == (48, 64)  # the lengths the script passes
    assert os.path.isfile(os.path.join(ROOT, TASK_FLAGS["--reward.remote_url"][0]))


def test_an_unknown_task_is_refused_by_name():
    env = dict(os.environ, ALGO="grpo", PRINT_CMD="1", TASK="sudoku")
    res = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "train_tiny_cpu.sh")], env=env, capture_output=True, text=True
    )
    assert res.returncode == 2 and "TASK must be addition or countdown, got 'sudoku'" in res.stderr


def test_the_build_and_the_demo_follow_the_task():
    train = open(os.path.join(SCRIPTS, "train_tiny_cpu.sh")).read()
    demo = open(os.path.join(SCRIPTS, "demo_tiny_cpu.sh")).read()
    for text in (train, demo):
        assert '-m openrlhf_dppo.tiny.build --out "$TINY" --seed 0 --task "$TASK"' in text
    assert (
        "export TASK=${TASK:-addition}" in demo and "countdown) RUNS=${RUNS:-runs/tiny_cpu_countdown}" in demo
    )


def test_algo_cppo_runs_the_cppo_peer_at_r_o():
    """ALGO=cppo: --dppo.method cppo at --dppo.completion_prune_rate R_O (0.5 unless set)."""
    for r_o, want in ((None, "0.5"), ("0.25", "0.25")):
        env = dict(os.environ, ALGO="cppo", PRINT_CMD="1")
        env.pop("R_O", None)
        if r_o is not None:
            env["R_O"] = r_o
        res = subprocess.run(
            ["bash", os.path.join(SCRIPTS, "train_tiny_cpu.sh")], env=env, capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr
        words = res.stdout.split()
        assert words[words.index("--dppo.method") + 1] == "cppo"
        assert words[words.index("--dppo.completion_prune_rate") + 1] == want
