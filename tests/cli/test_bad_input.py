"""Bad input stops the CLI before Ray starts, with a message naming the flag (and the file).

Each case runs ``python -m openrlhf_dppo.cli.train_dppo_ray`` in a subprocess, as a user would, with
a stand-in ``ray`` package first on the path that records its import and refuses: a refused command
must exit with status 2, name the flag, and never import ``ray`` (nothing can start a Ray cluster
without it). The accepted commands at the end are the check that this detection works: they get past
validation and reach the point where Ray is imported.
"""

import pytest
from cli_commands import local_command, replaced, run_cli, without


def _no_vllm(argv):
    return without(argv, "--vllm.num_engines")


def _no_reward(argv):
    return without(argv, "--reward.remote_url")


# id -> (how to change the valid local command, the flag the message must name, text it must contain)
REFUSED = {
    # a bad DPPO value is reported, not OpenRLHF's TypeError about the missing vLLM engines
    "bad-dppo-value-without-vllm": (lambda a: _no_vllm(a) + ["--dppo.q_min", "0"], "--dppo.q_min", "(0, 1]"),
    "dppo-needs-vllm-engines": (_no_vllm, "--vllm.num_engines", "DPPO needs vLLM engines"),
    "missing-prompt-dataset": (
        lambda a: replaced(a, "--data.prompt_dataset", "/nonexistent.jsonl"), "--data.prompt_dataset",
        "/nonexistent.jsonl: no such file",
    ),
    "missing-eval-dataset": (
        lambda a: a + ["--eval.dataset", "./missing_eval.jsonl"], "--eval.dataset", "./missing_eval.jsonl",
    ),
    "local-looking-dataset-dir": (
        lambda a: replaced(a, "--data.prompt_dataset", "./data/math"), "--data.prompt_dataset", "./data/math",
    ),
    "missing-reward-file": (
        lambda a: replaced(a, "--reward.remote_url", "/nonexistent/reward.py"), "--reward.remote_url",
        "/nonexistent/reward.py: no such reward-function file",
    ),
    "reward-url-scheme": (
        lambda a: replaced(a, "--reward.remote_url", "ftp://host/reward"), "--reward.remote_url",
        "'ftp://host/reward': expected a reward-function .py file or an http:// or https:// URL",
    ),
    "missing-agent-file": (
        lambda a: _no_reward(a) + ["--train.agent_func_path", "missing_agent.py"], "--train.agent_func_path",
        "missing_agent.py: no such file",
    ),
    "missing-model-path": (
        lambda a: replaced(a, "--actor.model_name_or_path", "/nonexistent/model"), "--actor.model_name_or_path",
        "/nonexistent/model: no such local path",
    ),
    "model-neither-path-nor-hub-id": (
        lambda a: replaced(a, "--actor.model_name_or_path", "my model"), "--actor.model_name_or_path",
        "my model: no such local path, and not a Hugging Face Hub id",
    ),
    "no-rewards-on-the-rollouts": (
        lambda a: _no_reward(a) + ["--reward.model_name_or_path", "org/rm"], "--reward.remote_url",
        "DPPO needs the rewards on the rollouts",
    ),
    "non-group-estimator": (
        lambda a: replaced(a, "--algo.advantage.estimator", "rloo"), "--algo.advantage.estimator",
        "needs a group estimator",
    ),
    "zero-train-token-budget": (
        lambda a: replaced(a, "--train.max_tokens_per_gpu", "0"), "--train.max_tokens_per_gpu",
        "a token budget per GPU must be >= 1",
    ),
    "zero-rollout-token-budget": (
        lambda a: a + ["--rollout.max_tokens_per_gpu", "0"], "--rollout.max_tokens_per_gpu",
        "a token budget per GPU must be >= 1",
    ),
    "max-len-over-the-token-budget": (
        lambda a: replaced(a, "--data.max_len", "256"), "--data.max_len",
        "256 exceeds --train.max_tokens_per_gpu 128",
    ),
    "no-room-for-the-prompt": (
        lambda a: replaced(a, "--rollout.max_new_tokens", "64"), "--rollout.max_new_tokens",
        "leaves no room for the prompt within --data.max_len 64",
    ),
    "gae-needs-every-sequence": (
        lambda a: replaced(a, "--algo.advantage.estimator", "gae"), "--algo.advantage.estimator",
        "a critic (GAE) needs every sequence",
    ),
    "async-training": (
        lambda a: a + ["--train.async_enable"], "--train.async_enable", "not supported by train_dppo_ray",
    ),
    "images-with-dppo": (
        lambda a: a + ["--data.max_images_per_prompt", "1"], "--data.max_images_per_prompt",
        "does not support for vision-language models",
    ),
    "vllm-generate-batch-size-differs": (
        lambda a: a + ["--rollout.vllm_generate_batch_size", "8"], "--rollout.vllm_generate_batch_size",
        "it must equal --rollout.batch_size",
    ),
    "moe-aux-loss-with-dppo": (
        lambda a: a + ["--actor.aux_loss_coef", "0.01"], "--actor.aux_loss_coef",
        "cannot carry DPPO's per-sequence weights",
    ),
    # the files must exist for the GRPO baseline too
    "grpo-missing-prompt-dataset": (
        lambda a: replaced(a, "--data.prompt_dataset", "/nonexistent.jsonl") + ["--dppo.enable", "false"],
        "--data.prompt_dataset", "/nonexistent.jsonl",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_input_is_refused_naming_the_flag_before_ray_is_imported(case, tmp_path):
    change, flag, text = REFUSED[case]
    proc, ray_imported = run_cli(change(local_command(tmp_path)), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"train_dppo_ray.py: error: {flag}: ") and text in last, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not ray_imported


ACCEPTED = {
    # names that are not local paths are Hugging Face Hub ids: left to the download
    "dppo-with-hub-ids": lambda a, d: replaced(
        replaced(a, "--actor.model_name_or_path", "Qwen/Qwen3-4B"), "--data.prompt_dataset", "openai/gsm8k"
    ),
    # an agent puts the rewards on the rollouts: DPPO accepts it without --reward.remote_url
    "dppo-with-an-agent": lambda a, d: _no_reward(a) + ["--train.agent_func_path", str(d / "reward.py")],
    # the GRPO baseline takes what OpenRLHF takes: DPPO's requirements do not apply
    "grpo-with-openrlhf-only-settings": lambda a, d: _no_reward(_no_vllm(a)) + [
        "--dppo.enable", "false", "--reward.model_name_or_path", "org/rm", "--actor.aux_loss_coef", "0.01",
        "--algo.advantage.estimator", "rloo", "--data.max_len", "256",
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_valid_input_gets_past_validation_to_ray(case, tmp_path):
    proc, ray_imported = run_cli(ACCEPTED[case](local_command(tmp_path), tmp_path), tmp_path)
    assert ray_imported, proc.stderr[-3000:]
    assert "tests/cli: ray imported" in proc.stderr and proc.returncode == 1
