"""Command lines shared by the CLI tests, and how a test runs the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from openrlhf_dppo.cli import train_dppo_ray as cli

ROOT = Path(__file__).resolve().parents[2]

# A GRPO command line as a user would run it with openrlhf.cli.train_ppo_ray (files of another machine:
# the in-process tests parse it without looking for them).
GRPO = [
    "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "2",
    "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "2",
    "--vllm.num_engines", "2", "--vllm.tensor_parallel_size", "1",
    "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--vllm.gpu_memory_utilization", "0.6",
    "--actor.model_name_or_path", "Qwen/Qwen3-4B",
    "--reward.remote_url", "examples/reward_func.py",
    "--ckpt.output_dir", "/tmp/grpo_out", "--ckpt.path", "/tmp/grpo_ckpt", "--ckpt.save_steps", "20",
    "--train.micro_batch_size", "4", "--train.batch_size", "128",
    "--rollout.micro_batch_size", "8", "--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "8",
    "--train.max_epochs", "1", "--data.max_len", "4096", "--rollout.max_new_tokens", "3072",
    "--ds.zero_stage", "3", "--ds.param_dtype", "bf16",
    "--actor.adam.lr", "1e-6", "--algo.kl.init_coef", "1e-3", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
    "--algo.advantage.estimator", "group_norm",
    "--data.prompt_dataset", "openai/gsm8k", "--data.input_key", "question", "--data.label_key", "answer",
    "--data.apply_chat_template", "--actor.gradient_checkpointing_enable",
    "--train.max_tokens_per_gpu", "16384",
]  # fmt: skip
DPPO = [
    "--dppo.prompt_prune_rate", "0.3", "--dppo.prompt_rate_control", "fixed", "--dppo.completion_prune_rate",
    "0.5", "--dppo.prompt_policy", "uniform", "--dppo.q_min", "0.2", "--dppo.p_min", "0.05", "--dppo.seed", "7",
]  # fmt: skip


def parse(argv, check_inputs: bool = False):
    """The namespace OpenRLHF's parser + validation and DPPO's hooks produce, stopped before Ray."""
    captured = {}

    def capture(args):
        captured["args"] = args
        return "stopped before ray"

    assert cli.main(argv, train_fn=capture, check_inputs=check_inputs) == "stopped before ray"
    return captured["args"]


def without(argv: list[str], flag: str) -> list[str]:
    """``argv`` less ``flag`` and its value."""
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :]


def replaced(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return argv[: i + 1] + [value] + argv[i + 2 :]


def local_command(tmp_path: Path) -> list[str]:
    """A small valid DPPO command whose model, dataset and reward files exist under ``tmp_path``."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "train.jsonl").write_text('{"input": "1+1", "label": "2"}\n')
    (tmp_path / "reward.py").write_text("def reward_func(queries, prompts, labels):\n    return None\n")
    return [
        "--actor.model_name_or_path", str(tmp_path / "model"),
        "--data.prompt_dataset", str(tmp_path / "train.jsonl"), "--data.input_key", "input",
        "--reward.remote_url", str(tmp_path / "reward.py"),
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
        "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--data.max_len", "64", "--rollout.max_new_tokens", "32", "--train.max_tokens_per_gpu", "128",
        "--ckpt.output_dir", str(tmp_path / "out"),
    ]  # fmt: skip


_RAY_STAND_IN = '''"""Stands in for Ray in tests/cli: records that it was imported, then refuses."""
import os
open(os.environ["DPPO_TEST_RAY_MARKER"], "w").write("ray was imported\\n")
raise ImportError("tests/cli: ray imported -- the command got past validation")
'''


def run_cli(
    argv: list[str], tmp_path: Path, environ: dict | None = None, timeout: float = 600
) -> tuple[subprocess.CompletedProcess, bool]:
    """Run ``python -m openrlhf_dppo.cli.train_dppo_ray ARGV`` as a user would (cwd ``tmp_path``), with
    a stand-in ``ray`` package first on the path. Returns (the process, whether ``ray`` was imported):
    nothing can start a Ray cluster without importing ``ray``. ``environ``: variables set for it
    (``RAY_ADDRESS`` is unset otherwise)."""
    blocker = tmp_path / "ray_blocker"
    (blocker / "ray").mkdir(parents=True, exist_ok=True)
    (blocker / "ray" / "__init__.py").write_text(_RAY_STAND_IN)
    marker = tmp_path / "ray_imported"
    marker.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(ROOT), env.get("PYTHONPATH", "")])
    env["DPPO_TEST_RAY_MARKER"] = str(marker)
    env.pop("RAY_ADDRESS", None)
    env.update(environ or {})
    proc = subprocess.run(
        [sys.executable, "-m", "openrlhf_dppo.cli.train_dppo_ray", *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return proc, marker.exists()


class _Stop(Exception):
    pass


def full_parser():
    """OpenRLHF's parser with the DPPO group, as the entry point builds it (nothing parsed)."""
    origin, module = cli._load_openrlhf_main()
    seen = {}

    def hook(parser):
        seen["parser"] = cli.add_dppo_arguments(parser)
        raise _Stop

    try:
        exec(
            compile(module, origin, "exec"),
            {"__name__": "__main__", cli.PARSE_HOOK: hook, cli.TRAIN_HOOK: None},
        )
    except _Stop:
        pass
    return seen["parser"]
