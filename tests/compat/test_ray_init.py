"""What the ``ray.init`` wrapper hands Ray: stand-in GPUs, the setup hook, the workers' environment."""

from __future__ import annotations

import importlib

from openrlhf_dppo.compat import cpu
from openrlhf_dppo.compat.cpu.ray_init import SETUP_HOOK, ray_init_kwargs, worker_pythonpath


def test_ray_init_kwargs_merge_the_callers_runtime_env(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv(cpu.ENV_VERIFY, "/tmp/x.jsonl")
    kw = ray_init_kwargs({"runtime_env": {"env_vars": {"NCCL_DEBUG": "INFO"}}}, fake_gpus=3, num_cpus=None)
    env = kw["runtime_env"]["env_vars"]
    assert kw["num_gpus"] == 3 and kw["num_cpus"] >= 8 and kw["include_dashboard"] is False
    assert kw["runtime_env"]["worker_process_setup_hook"] == "openrlhf_dppo.compat.cpu.worker_setup"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env[cpu.ENV_VERIFY] == "/tmp/x.jsonl"


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
