"""What the ``ray.init`` wrapper hands Ray: stand-in GPUs, the setup hook, the workers' environment."""

from __future__ import annotations

import importlib

from openrlhf_dppo.compat import cpu
from openrlhf_dppo.compat.cpu.ray_init import SETUP_HOOK, ray_init_kwargs, worker_pythonpath


def test_ray_init_kwargs_merge_the_callers_runtime_env(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv(cpu.hooks.ENV_VERIFY, "/tmp/x.jsonl")
    kw = ray_init_kwargs({"runtime_env": {"env_vars": {"NCCL_DEBUG": "INFO"}}}, fake_gpus=3, num_cpus=None)
    env = kw["runtime_env"]["env_vars"]
    assert kw["num_gpus"] == 3 and kw["num_cpus"] >= 8 and kw["include_dashboard"] is False
    assert kw["runtime_env"]["worker_process_setup_hook"] == "openrlhf_dppo.compat.cpu.worker_setup"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env[cpu.hooks.ENV_VERIFY] == "/tmp/x.jsonl"


def test_ray_init_kwargs_join_an_existing_cluster_without_local_resources(monkeypatch):
    # Ray refuses num_gpus / num_cpus / include_dashboard when connecting to a running cluster
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    kw = ray_init_kwargs({}, fake_gpus=3, num_cpus=None)
    assert not {"num_gpus", "num_cpus", "include_dashboard"} & set(kw)
    assert kw["runtime_env"]["worker_process_setup_hook"] == SETUP_HOOK
    monkeypatch.delenv("RAY_ADDRESS")
    kw = ray_init_kwargs({"address": "10.0.0.1:6379"}, fake_gpus=3, num_cpus=None)
    assert "num_gpus" not in kw and kw["address"] == "10.0.0.1:6379"


def test_the_setup_hook_ray_is_given_names_worker_setup():
    module, _, attr = SETUP_HOOK.rpartition(".")
    assert getattr(importlib.import_module(module), attr) is cpu.worker_setup


def test_worker_pythonpath_puts_this_checkout_and_the_stand_in_first_once(repo_root, monkeypatch):
    from openrlhf_dppo.compat.flash_attn_stub import STUB_PATH

    monkeypatch.setenv("PYTHONPATH", f"/elsewhere:{repo_root}:/other")
    assert worker_pythonpath().split(":") == [str(repo_root), STUB_PATH, "/elsewhere", "/other"]


def parsed(extra: list[str]):
    """The namespace a train_dppo_ray command line gives ``train(args)`` (stopped before Ray)."""
    from openrlhf_dppo.cli import train_dppo_ray

    base = [
        "--actor.model_name_or_path", "Qwen/Qwen3-0.6B", "--data.prompt_dataset", "openai/gsm8k",
        "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "32",
        "--data.max_len", "64", "--rollout.max_new_tokens", "32",
    ]  # fmt: skip
    out = {}
    train_dppo_ray.main(base + extra, train_fn=lambda a: out.setdefault("args", a))
    return out["args"]


DPPO_RUN = ["--reward.remote_url", "reward.py", "--algo.advantage.estimator", "group_norm"]


def test_stand_in_gpus_count_every_group_and_engine_so_no_placement_group_waits_forever():
    # DP = 2 actor, a reference on 2 GPUs (KL on), 2 engines: 6, more than the old fixed 4
    argv = DPPO_RUN + ["--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2"]
    argv += ["--vllm.num_engines", "2"]
    assert cpu.stand_in_gpus(parsed(argv + ["--algo.kl.init_coef", "0.01"])) == 6
    assert cpu.stand_in_gpus(parsed(argv + ["--algo.kl.init_coef", "0"])) == 4  # no reference model
    # colocation shares GPUs: the count is an upper bound of what the placement groups request
    one = DPPO_RUN + ["--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--algo.kl.init_coef", "0"]
    assert cpu.stand_in_gpus(parsed(one + ["--train.colocate_all"])) == 2
    assert cpu.stand_in_gpus(parsed(one + ["--vllm.tensor_parallel_size", "2"])) == 3


def test_stand_in_gpus_count_a_reward_model_and_a_critic():
    grpo = ["--dppo.method", "grpo", "--algo.kl.init_coef", "0", "--actor.num_gpus_per_node", "1"]
    grpo += ["--vllm.num_engines", "1", "--reward.model_name_or_path", "rm"]
    grpo += ["--reward.num_gpus_per_node", "2"]
    assert cpu.stand_in_gpus(parsed(grpo + ["--algo.advantage.estimator", "group_norm"])) == 1 + 1 + 2
    # gae: OpenRLHF's validation makes the reward model the critic (its own group of GPUs)
    gae = parsed(grpo + ["--algo.advantage.estimator", "gae", "--critic.num_gpus_per_node", "3"])
    assert gae.critic.model_name_or_path == "rm" and cpu.stand_in_gpus(gae) == 1 + 1 + 2 + 3


def test_ray_is_given_a_logical_cpu_for_every_stand_in_gpu_bundle():
    assert ray_init_kwargs({}, fake_gpus=4, num_cpus=None)["num_cpus"] >= 8
    assert ray_init_kwargs({}, fake_gpus=9, num_cpus=None)["num_cpus"] >= 9 + 4
