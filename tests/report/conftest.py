"""Hand-written run directories for the compare report tests.

Two 5-step runs whose every number is chosen so that the expected speedups can be derived by hand
(the derivations are in test_speedups.py). Rewards are multiples of 1/8 so that the smoothed rewards
are exact in binary floating point.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

BASE_ARGS = {
    "actor": {"model_name_or_path": "tiny/qwen3", "learning_rate": 1e-6},
    "rollout": {"n_samples_per_prompt": 4, "batch_size": 8},
    "train": {"seed": 42, "max_epochs": 1},
    "data": {"prompt_dataset": "tiny/arith", "max_len": 256},
    "ckpt": {"output_dir": "OUT", "path": "OUT/ckpt"},
    "logger": {"wandb": {"run_name": "NAME"}, "tensorboard_dir": None},
    "dppo": {"prompt_prune_rate": 0.0, "completion_prune_rate": 0.0},
}
HARDWARE = {"hostname": "node1", "cpu": "x86", "num_cpus": 2, "gpus": [], "num_gpus": 0}

# GRPO: phases (gen, make_experience, ppo_train, broadcast) sum to the step total
GRPO_PHASES = [(6.0, 2.0, 1.5, 0.5), (2.0, 1.0, 0.75, 0.25), (2.0, 1.0, 0.75, 0.25), (3.0, 1.0, 0.75, 0.25)]
GRPO_PHASES.append((2.0, 1.0, 0.75, 0.25))  # totals: 10, 4, 4, 5, 4
GRPO_REWARD = [0.0, 0.25, 0.25, 0.5, 0.5]
DPPO_PHASES = [(4.0, 2.0, 1.5, 0.5), (1.0, 0.5, 0.25, 0.25), (1.0, 0.5, 0.25, 0.25), (1.5, 0.5, 0.25, 0.25)]
DPPO_PHASES.append((1.0, 0.5, 0.25, 0.25))  # totals: 8, 2, 2, 2.5, 2
DPPO_REWARD = [0.25, 0.25, 0.5, 0.5, 0.75]
PROMPT_KEEP = [1.0, 0.5, 0.5, 0.5, 0.5]
COMPLETION_KEEP = [1.0, 0.625, 0.375, 0.5, 0.5]

EVAL_RESULTS = {
    "model": "ckpt",
    "k": 4,
    "benchmarks": {
        "math500": {"avg@k": 0.5, "pass@k": 0.75, "n": 8},
        "gsm8k": {"avg@k": 0.25, "pass@k": 0.5, "n": 8},
    },
    "average": {"avg@k": 0.375, "pass@k": 0.625},
}


def train_rows(phases, rewards, extra=None, startup=0.0, time_keys=False) -> list[dict]:
    """Train lines; ``time_keys`` adds what the run directory's writer adds today (time/train_s on
    every line, time/startup_s on the first); without it the lines are those of older runs."""
    rows, wall = [], startup
    for i, (gen, exp, train, bcast) in enumerate(phases):
        total = gen + exp + train + bcast
        wall += total
        row = {
            "kind": "train",
            "step": i + 1,
            "time": 1_700_000_000.0 + wall,
            "wall_time": wall,
            "timing/generation": gen,
            "timing/make_experience": exp,
            "timing/ppo_train": train,
            "timing/broadcast": bcast,
            "timing/step_total": total,
            "rollout/reward_mean": rewards[i],
            "tokens/generated": 100.0,
            "tokens/trained": 100.0,
            "tokens/pruned": 0.0,
            "samples/generated": 32.0,
            "samples/trained": 32.0,
            "samples/pruned": 0.0,
            "policy_loss": 0.1,
        }
        if time_keys:
            row["time/train_s"] = wall - startup
            if i == 0:
                row["time/startup_s"] = startup
        row.update((extra or {}).get(i, {}))
        rows.append(row)
    return rows


def curve_run(
    path: Path,
    *,
    step_time: float,
    evals: list[float],
    eval_every: int = 2,
    startup: float = 0.0,
    seed: int = 42,
    algo: str = "grpo",
    dataset: str = "arith",
    eval_n: float | None = 256.0,
    time_keys: bool = True,
) -> Path:
    """A run of ``eval_every * (len(evals) - 1)`` steps of ``step_time`` seconds each (generation half
    of it), start-up ``startup``, with held-out evaluations ``evals`` at steps 0, eval_every, ...; the
    eval lines carry time/train_s = step x step_time (``time_keys``) and eval_num_samples ``eval_n``."""
    steps = eval_every * (len(evals) - 1)
    phase = (step_time / 2, step_time / 4, step_time / 8, step_time / 8)
    train = train_rows([phase] * steps, [0.5] * steps, startup=startup, time_keys=time_keys)
    rows = []
    for i, value in enumerate(evals):
        step = i * eval_every
        rows += train[step - eval_every : step] if step else []
        line = {"kind": "eval", "step": step, "time": 1_700_000_000.0 + startup + step * step_time}
        line.update(
            {"wall_time": startup + step * step_time, f"eval_{dataset}_pass1": value, "timing/eval": 1.5}
        )
        if eval_n is not None:
            line["eval_num_samples"] = eval_n
        if time_keys:
            line["time/train_s"] = step * step_time
        rows.append(line)
    args = json.loads(json.dumps(BASE_ARGS))
    args["train"]["seed"] = seed
    dppo = {"enable": algo == "dppo", "prompt_prune_rate": 0.5 if algo == "dppo" else 0.0, "seed": seed}
    dppo["completion_prune_rate"] = dppo["prompt_prune_rate"]
    args["dppo"] = dict(dppo)
    return write_run(path, rows, algo=algo, args=args, dppo=dppo, status={"state": "finished", "step": steps})


def dppo_extra() -> dict[int, dict]:
    extra = {}
    for i in range(5):
        extra[i] = {
            "tokens/generated": 50.0,
            "tokens/trained": 25.0,
            "tokens/pruned": 25.0,
            # only the kept prompts are rolled out (shrink): GRPO's 32 samples a step x the kept fraction
            "samples/generated": 32.0 * PROMPT_KEEP[i],
            "samples/trained": 32.0 * PROMPT_KEEP[i] * COMPLETION_KEEP[i],
            "samples/pruned": 32.0 * PROMPT_KEEP[i] * (1.0 - COMPLETION_KEEP[i]),
            "dppo/prompt_keep_frac": PROMPT_KEEP[i],
            "dppo/completion_keep_frac": COMPLETION_KEEP[i],
            "dppo/weight_mean": 1.0,
            "dppo/weight_max": 2.0 + i,
            "dppo/weight_ess": 0.8,
            "dppo/pack_density": 0.9,
            "dppo/pack_micro_batches": 3.0,
            "dppo/pack_lower_bound": 2.0,
            "dppo/pack_rank_imbalance": 1.0,
        }
    return extra


def write_run(
    path: Path,
    rows: list[dict],
    *,
    algo: str = "grpo",
    args: dict | None = None,
    dppo: dict | None = None,
    hardware: dict | None = None,
    status: dict | None | str = "finished",
    eval_results: dict | None = None,
    extra_lines: list[str] = (),
) -> Path:
    path.mkdir(parents=True)
    config = {
        "openrlhf_dppo_version": "0.1.0",
        "openrlhf_version": "0.11.2",
        "argv": ["train", str(path)],
        "args": json.loads(json.dumps(args or BASE_ARGS)),
        "dppo": dppo or {"enable": algo == "dppo", "prompt_prune_rate": 0.0, "completion_prune_rate": 0.0},
        "algo": algo,
        "hardware": hardware or HARDWARE,
        "start_time": 1_700_000_000.0,
    }
    config["args"]["ckpt"]["output_dir"] = str(path)
    (path / "run_config.json").write_text(json.dumps(config))
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    (path / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if status is not None:
        if isinstance(status, str):
            status = {"state": status, "step": len(rows), "max_steps": 5, "updated": 1_700_000_100.0}
        (path / "status.json").write_text(json.dumps(status))
    if eval_results is not None:
        (path / "eval_results.json").write_text(json.dumps(eval_results))
    return path


@pytest.fixture
def grpo_dir(tmp_path) -> Path:
    return write_run(
        tmp_path / "grpo", train_rows(GRPO_PHASES, GRPO_REWARD), algo="grpo", eval_results=EVAL_RESULTS
    )


@pytest.fixture
def dppo_dir(tmp_path) -> Path:
    args = json.loads(json.dumps(BASE_ARGS))
    args["dppo"] = {"prompt_prune_rate": 0.5, "completion_prune_rate": 0.5}
    dppo = {"enable": True, "prompt_prune_rate": 0.5, "completion_prune_rate": 0.5}
    rows = train_rows(DPPO_PHASES, DPPO_REWARD, dppo_extra())
    rows.insert(2, {"kind": "eval", "step": 2, "time": 0.0, "wall_time": 10.0, "eval_math500_pass1": 0.25})
    eval_results = {
        "model": "ckpt",
        "k": 4,
        "benchmarks": {"math500": {"avg@k": 0.625, "pass@k": 0.75, "n": 8}, "gsm8k": {"avg@k": 0.25, "n": 8}},
        "average": {"avg@k": 0.4375, "pass@k": 0.625},
    }
    return write_run(tmp_path / "dppo", rows, algo="dppo", args=args, dppo=dppo, eval_results=eval_results)


@pytest.fixture
def rundirs() -> SimpleNamespace:
    """The builders above for tests that write their own runs (tests import no sibling modules)."""
    return SimpleNamespace(
        write_run=write_run,
        train_rows=train_rows,
        curve_run=curve_run,
        GRPO_PHASES=GRPO_PHASES,
        GRPO_REWARD=GRPO_REWARD,
    )
