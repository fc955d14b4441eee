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
DPPO_ONLY = {"--dppo.prompt_prune_rate", "--dppo.completion_prune_rate", "--dppo.seed"}


def command(algo: str, **env: str) -> list[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("STEPS", "SEED", "LR", "OUT", "TINY")}
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
    assert grpo.pop("--dppo.enable") == ["false"] and dppo.pop("--dppo.enable") == ["true"]
    assert {k: dppo.pop(k) for k in DPPO_ONLY} == {
        "--dppo.prompt_prune_rate": ["0.5"],
        "--dppo.completion_prune_rate": ["0.5"],
        "--dppo.seed": ["1"],
    }
    assert grpo == dppo


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
    # refill draws 2 x PROMPTS per step at r_q = 0.5 and dynamic filtering about 1.8 x: a run that ran out
    # of episodes stopped early (the benchmark's refill and DF arms once stopped at 80 of 150 steps)
    assert episodes == math.ceil(4 * steps * prompts / 2000)
    assert episodes * 2000 >= 2 * steps * prompts


def test_seed_and_learning_rate_reach_the_command():
    f = flags(command("dppo", SEED="7", LR="3e-4", R_Q="0.3", R_O="0.7"))
    assert f["--train.seed"] == ["7"] and f["--dppo.seed"] == ["7"]
    assert f["--actor.adam.lr"] == ["3e-4"]
    assert f["--dppo.prompt_prune_rate"] == ["0.3"] and f["--dppo.completion_prune_rate"] == ["0.7"]


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
    assert res.returncode == 2 and "ALGO must be grpo or dppo, got 'ppo'" in res.stderr


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
