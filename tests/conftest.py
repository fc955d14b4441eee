"""Shared pytest setup and fixtures. tests/ is deliberately not a package (see pyproject.toml).

Fixtures used by more than one test folder live here; a folder's own fixtures live in its conftest.py.
"""

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

# DeepSpeed picks its accelerator at import; on CPU machines make the choice explicit and quiet.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The tests import OpenRLHF modules directly (before any adapter module would prepare the host): the
# version guard and, on CPU, the flash-attn stand-in go in first. `import openrlhf_dppo` alone does
# neither (tests/foundation checks that in a subprocess).
from openrlhf_dppo._host import prepare_host  # noqa: E402

prepare_host()

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout's root directory (the one holding openrlhf_dppo/ and tests/)."""
    return REPO_ROOT


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for gloo / TCPStore rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- run directories written by hand (for the readers: run_dir, the report, the tiny summary) ----------
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
    dppo = {"method": algo, "prompt_prune_rate": 0.5 if algo == "dppo" else 0.0, "seed": seed}
    dppo["completion_prune_rate"] = dppo["prompt_prune_rate"]
    args["dppo"] = dict(dppo)
    return write_run(path, rows, algo=algo, args=args, dppo=dppo, status={"state": "finished", "step": steps})


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
        "dppo": dppo or {"method": algo, "prompt_prune_rate": 0.0, "completion_prune_rate": 0.0},
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
def rundirs() -> SimpleNamespace:
    """The run-directory builders above (tests import no sibling modules)."""
    return SimpleNamespace(
        write_run=write_run, train_rows=train_rows, curve_run=curve_run, BASE_ARGS=BASE_ARGS
    )
