"""Bad input stops the CLI before Ray starts, with a message naming the flag (and the file).

Each case runs ``python -m openrlhf_dppo.cli.train_dppo_ray`` in a subprocess, as a user would, with
a stand-in ``ray`` package first on the path that records its import and refuses: a refused command
must exit with status 2, name the flag, and never import ``ray`` (nothing can start a Ray cluster
without it). The accepted commands at the end are the check that this detection works: they get past
validation and reach the point where Ray is imported.
"""

import socket
from pathlib import Path

import pytest
from cli_commands import local_command, replaced, run_cli, without


def _no_vllm(argv):
    return without(argv, "--vllm.num_engines")


def _no_reward(argv):
    return without(argv, "--reward.remote_url")


def _file(argv, name: str, text: str) -> str:
    """Write ``name`` beside the local command's files (its model directory's parent); returns its path."""
    path = Path(argv[argv.index("--actor.model_name_or_path") + 1]).parent / name
    path.write_text(text)
    return str(path)


def _with_reward(argv, text: str):
    return replaced(argv, "--reward.remote_url", _file(argv, "bad_reward.py", text))


def _with_dataset(argv, name: str, text: str):
    return replaced(argv, "--data.prompt_dataset", _file(argv, name, text))


def _closed_loopback_url() -> str:
    """An http URL on this machine's loopback where nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/get_reward"


AGENT = "class AgentExecutor:\n    pass\n"


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
        lambda a: replaced(a, "--algo.advantage.estimator", "reinforce"), "--algo.advantage.estimator",
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
    # 4 x 4 rollouts a batch against a train batch of 32: OpenRLHF's whole-train-batch rule trains nothing
    "train-batch-larger-than-a-rollout-batch": (
        lambda a: replaced(a, "--train.batch_size", "32"), "--train.batch_size",
        "32 exceeds a rollout batch of --rollout.batch_size 4 x --rollout.n_samples_per_prompt 4 = 16",
    ),
    "no-room-for-the-prompt": (
        lambda a: replaced(a, "--rollout.max_new_tokens", "64"), "--rollout.max_new_tokens",
        "leaves no room for the prompt within --data.max_len 64",
    ),
    "gae-needs-every-sequence": (
        lambda a: replaced(a, "--algo.advantage.estimator", "gae"), "--algo.advantage.estimator",
        "a critic (GAE) needs every sequence",
    ),
    "partial-rollout-without-async": (
        lambda a: a + ["--train.partial_rollout_enable"], "--train.partial_rollout_enable",
        "needs --train.async_enable",
    ),
    "sleep-with-async": (
        lambda a: a + ["--train.async_enable", "--train.colocate_all", "--vllm.enable_sleep"],
        "--vllm.enable_sleep", "not with --train.async_enable",
    ),
    "over-sampling-without-async": (
        lambda a: a + ["--dppo.method", "grpo", "--rollout.vllm_generate_batch_size", "64"],
        "--rollout.vllm_generate_batch_size", "needs --train.async_enable",
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
    "prompt-rate-above-the-zero-share-cap": (
        lambda a: a + ["--dppo.prompt_prune_rate", "0.8"], "--dppo.prompt_prune_rate",
        "0.8: expected at most 0.7 under --dppo.prompt_rate_control zero-share",
    ),
    # what the run writes: created inside Ray today, so checked here
    "output-dir-under-a-file": (
        lambda a: replaced(a, "--ckpt.output_dir", a[a.index("--data.prompt_dataset") + 1] + "/out"),
        "--ckpt.output_dir", "train.jsonl/out: cannot be created: ",
    ),
    "run-dir-not-writable": (
        lambda a: a + ["--dppo.run_dir", "/proc/dppo-run"], "--dppo.run_dir",
        "/proc/dppo-run: not writable (cannot create it in /proc",
    ),
    "checkpoint-dir-under-a-file": (
        lambda a: a + ["--ckpt.save_steps", "2", "--ckpt.path", _file(a, "f.txt", "x") + "/ckpt"],
        "--ckpt.path", "f.txt/ckpt: cannot be created: ",
    ),
    # the reward file is imported (in a child process) and must have OpenRLHF's reward_func
    "reward-file-does-not-import": (
        lambda a: _with_reward(a, "import numpy\nimport no_such_module_dppo\n"), "--reward.remote_url",
        "bad_reward.py does not import: ModuleNotFoundError: No module named 'no_such_module_dppo' (line 2)",
    ),
    "reward-file-syntax-error": (
        lambda a: _with_reward(a, "def reward_func(queries, prompts, labels)\n    return 1\n"),
        "--reward.remote_url", "bad_reward.py does not import: SyntaxError",
    ),
    "reward-file-without-reward-func": (
        lambda a: _with_reward(a, "def reward(queries, prompts, labels):\n    return None\n"),
        "--reward.remote_url", "bad_reward.py has no function reward_func(queries, prompts, labels)",
    ),
    "reward-func-with-the-wrong-arguments": (
        lambda a: _with_reward(a, "def reward_func(queries):\n    return None\n"), "--reward.remote_url",
        "reward_func(queries) cannot be called as reward_func(queries, prompts, labels)",
    ),
    "agent-file-without-agent-executor": (
        lambda a: _no_reward(a) + ["--train.agent_func_path", _file(a, "agent.py", "x = 1\n")],
        "--train.agent_func_path", "agent.py has no class AgentExecutor",
    ),
    "reward-url-does-not-answer": (
        lambda a: replaced(a, "--reward.remote_url", _closed_loopback_url()), "--reward.remote_url",
        "/get_reward: nothing answers at 127.0.0.1:",
    ),
    # the dataset's first record must have the keys
    "input-key-missing-jsonl": (
        lambda a: replaced(a, "--data.input_key", "question"), "--data.input_key",
        "'question' is not a field of the first record of ",
    ),
    "label-key-missing-jsonl": (
        lambda a: a + ["--data.label_key", "answer"], "--data.label_key",
        "'answer' is not a field of the first record of ",
    ),
    "input-key-missing-json-array": (
        lambda a: _with_dataset(a, "train.json", '[{"prompt": "1+1", "label": "2"}]'), "--data.input_key",
        "'input' is not a field of the first record of ",
    ),
    "input-key-missing-eval-jsonl": (
        lambda a: a + ["--eval.dataset", _file(a, "eval.jsonl", '{"question": "2+2"}\n')], "--data.input_key",
        "eval.jsonl (its fields: 'question')",
    ),
    # OpenRLHF's own asserts, refused with the flag's name instead of an AssertionError traceback
    "dynamic-filtering-range-reversed": (
        lambda a: a + ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.99", "0.01"],
        "--algo.dynamic_filtering_range", "0.99 0.01: expected LOW HIGH with LOW < HIGH",
    ),
    "fewer-sample-batches-than-actor-processes": (
        lambda a: a + ["--rollout.micro_batch_size", "32"], "--rollout.micro_batch_size",
        "makes 0 micro-batches of 32, fewer than the 1 actor processes",
    ),
    "colocated-vllm-gpus-differ-from-the-actor": (
        lambda a: a + ["--train.colocate_all", "--vllm.tensor_parallel_size", "2"], "--vllm.num_engines",
        "1 x --vllm.tensor_parallel_size 2 GPUs for vLLM, but the actor has 1",
    ),
    "colocated-ref-differs-from-the-actor": (
        lambda a: replaced(a, "--algo.kl.init_coef", "0.01") + ["--train.colocate_actor_ref", "--ref.num_nodes", "2"],
        "--ref.num_gpus_per_node", "must equal --actor.num_nodes and --actor.num_gpus_per_node",
    ),
    # the files must exist for the GRPO baseline too
    "grpo-missing-prompt-dataset": (
        lambda a: replaced(a, "--data.prompt_dataset", "/nonexistent.jsonl") + ["--dppo.method", "grpo"],
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
    # ... unless such a batch trains as one step
    "train-batch-larger-under-short-batch-train": lambda a, d: replaced(a, "--train.batch_size", "32")
    + ["--dppo.short_batch", "train"],
    # names that are not local paths are Hugging Face Hub ids: left to the download
    "dppo-with-hub-ids": lambda a, d: replaced(
        replaced(a, "--actor.model_name_or_path", "Qwen/Qwen3-4B"), "--data.prompt_dataset", "openai/gsm8k"
    ),
    # an agent puts the rewards on the rollouts: DPPO accepts it without --reward.remote_url
    "dppo-with-an-agent": lambda a, d: _no_reward(a) + ["--train.agent_func_path", _file(a, "agent.py", AGENT)],
    # a .json dataset holding JSON Lines, with the keys
    "json-lines-in-a-json-file": lambda a, d: _with_dataset(a, "t.json", '{"input": "1+1"}\n{"input": "2"}\n'),
    # the GRPO baseline takes what OpenRLHF takes: DPPO's requirements do not apply
    "grpo-with-openrlhf-only-settings": lambda a, d: _no_reward(_no_vllm(a)) + [
        "--dppo.method", "grpo", "--reward.model_name_or_path", "org/rm", "--actor.aux_loss_coef", "0.01",
        "--algo.advantage.estimator", "reinforce", "--data.max_len", "256",
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_valid_input_gets_past_validation_to_ray(case, tmp_path):
    proc, ray_imported = run_cli(ACCEPTED[case](local_command(tmp_path), tmp_path), tmp_path)
    assert ray_imported, proc.stderr[-3000:]
    assert "tests/cli: ray imported" in proc.stderr and proc.returncode == 1


UNREACHABLE = {"RAY_ADDRESS": "127.0.0.1:9"}  # the discard port: no Ray cluster answers there


def test_help_and_bad_input_do_not_wait_for_the_cluster_in_ray_address(tmp_path):
    # the cluster is asked where the workers compute only once the command line is parsed and validated:
    # Ray's own connection to an unreachable address retries for minutes (the timeout: a start-up here, not
    # a speed limit)
    proc, ray_imported = run_cli(["--help"], tmp_path, UNREACHABLE, timeout=120)
    assert proc.returncode == 0 and "--dppo.prompt_rate_control" in proc.stdout and not ray_imported, (
        proc.stderr[-3000:]
    )
    argv = local_command(tmp_path) + ["--dppo.prompt_prune_rate", "1.5"]
    proc, ray_imported = run_cli(argv, tmp_path, UNREACHABLE, timeout=120)
    assert proc.returncode == 2 and not ray_imported, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("train_dppo_ray.py: error: --dppo.prompt_prune_rate: ")
    )


def test_a_valid_command_and_an_unreachable_cluster_get_a_clear_error_naming_ray_address(tmp_path):
    proc, ray_imported = run_cli(local_command(tmp_path), tmp_path, UNREACHABLE, timeout=120)
    assert proc.returncode == 2 and not ray_imported, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "train_dppo_ray.py: error: RAY_ADDRESS='127.0.0.1:9': could not ask the Ray cluster whether it has "
        "GPUs (nothing answers at 127.0.0.1:9: "
    ), proc.stderr[-3000:]
    assert last.endswith("set OPENRLHF_DPPO_DEVICE=cuda or OPENRLHF_DPPO_DEVICE=cpu to decide without asking")
    assert "Traceback" not in proc.stderr


def test_a_reward_url_that_answers_gets_past_validation(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts connections (backlog): it answers
        url = f"http://127.0.0.1:{server.getsockname()[1]}/get_reward"
        proc, ray_imported = run_cli(replaced(local_command(tmp_path), "--reward.remote_url", url), tmp_path)
    assert ray_imported, proc.stderr[-3000:]


def test_an_openrlhf_assert_not_checked_by_name_is_one_line_not_a_traceback(tmp_path):
    # GRPO baseline, one completion per prompt: OpenRLHF's validation asserts n_samples_per_prompt > 1
    argv = replaced(local_command(tmp_path), "--rollout.n_samples_per_prompt", "1") + [
        "--dppo.method",
        "grpo",
    ]
    proc, ray_imported = run_cli(argv, tmp_path)
    assert proc.returncode == 2 and not ray_imported, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "train_dppo_ray.py: error: OpenRLHF refused the arguments: group_norm requires n_samples_per_prompt > 1"
    ), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
