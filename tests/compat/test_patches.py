"""The patch table: the switches, which patch is installed where, and what ``apply()`` leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from openrlhf_dppo.compat import cpu
from openrlhf_dppo.compat.cpu import patches


def test_switches_come_from_the_keyword_first_then_the_environment(monkeypatch):
    monkeypatch.setenv(cpu.ENV_DISABLE, "plain_linear, watchdog")
    assert not cpu.enabled("plain_linear") and not cpu.enabled("watchdog") and cpu.enabled("cuda_stubs")
    assert cpu.enabled("plain_linear", {"plain_linear": True})
    assert not cpu.enabled("cuda_stubs", {"cuda_stubs": False})


def test_an_unknown_patch_name_is_refused_everywhere_with_the_known_names():
    with pytest.raises(ValueError, match="unknown CPU patch 'nope'; known: ray_fake_gpus, cuda_stubs"):
        cpu.enabled("nope")
    with pytest.raises(ValueError, match=r"unknown CPU patch\(es\) \['nope'\]"):
        cpu.apply(nope=False)
    with pytest.raises(ValueError, match="unknown site 'gpu'"):
        cpu.install("gpu")


def test_every_patch_says_why_and_applies_somewhere_known():
    for name, patch in cpu.PATCHES.items():
        assert patch.name == name
        assert len(patch.why) > 40, name
        assert patch.where and set(patch.where) <= set(cpu.patches.SITES), name


@pytest.fixture
def recorded(monkeypatch):
    """The real table with every installer replaced by one that records (name, site)."""
    calls: list[tuple[str, str]] = []

    def recorder(name, site):
        return lambda: calls.append((name, site))

    table = tuple(
        patches.Patch(p.name, {s: (recorder(p.name, s) if f else None) for s, f in p.where.items()}, p.why)
        for p in patches._TABLE
    )
    monkeypatch.setattr(patches, "_TABLE", table)
    return calls


# Where each patch is installed at start-up, in order (written out by hand from the layer's design:
# the driver imports the same host modules as the Ray workers and also hands vLLM our extension; vLLM's
# own engine workers need only the CUDA stubs and the plain linear layers).
RAY_WORKER_ORDER = [
    "cuda_stubs",
    "device_mesh",
    "replay_buffer_device",
    "sdpa_for_flash_attn",
    "zero3_gather",
    "gloo_weight_sync",
    "fp32_param_dtype",
    "verify_sync",
    "watchdog",
]


def test_each_site_installs_its_patches_in_table_order(recorded):
    assert cpu.install(cpu.RAY_WORKER) == RAY_WORKER_ORDER
    driver = (
        RAY_WORKER_ORDER[:6] + ["worker_extension", "fp32_param_dtype", "engine_dtype"] + RAY_WORKER_ORDER[7:]
    )
    assert cpu.install(cpu.DRIVER) == driver
    assert cpu.install(cpu.patches.VLLM_ENGINE) == ["cuda_stubs", "amx_state", "plain_linear"]
    assert recorded == (
        [(n, cpu.RAY_WORKER) for n in RAY_WORKER_ORDER]
        + [(n, cpu.DRIVER) for n in driver]
        + [(n, cpu.patches.VLLM_ENGINE) for n in ("cuda_stubs", "amx_state", "plain_linear")]
    )


def test_a_switched_off_patch_is_installed_nowhere(recorded, monkeypatch):
    monkeypatch.setenv(cpu.ENV_DISABLE, "cuda_stubs")
    assert "cuda_stubs" not in cpu.install(cpu.patches.VLLM_ENGINE) + cpu.install(cpu.RAY_WORKER)
    assert cpu.install(cpu.DRIVER, {"cuda_stubs": True})[0] == "cuda_stubs"
    assert all(name != "cuda_stubs" for name, site in recorded if site != cpu.DRIVER)


def test_apply_is_a_no_op_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    import ray

    init_before = ray.init
    assert cpu.apply() is False
    assert cpu.ENV_ACTIVE not in os.environ and ray.init is init_before


def test_apply_hands_the_switches_to_the_workers_and_starts_nothing(repo_root):
    # in a fresh interpreter: apply() patches this process for good
    code = textwrap.dedent(
        """
        import json, os, sys
        os.environ["OPENRLHF_DPPO_CPU_DISABLE"] = "watchdog,device_mesh"
        from openrlhf_dppo.compat import cpu
        assert cpu.apply(plain_linear=False, watchdog=True) is True
        loaded = sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "openrlhf", "deepspeed"})
        import ray, torch
        from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
        print(json.dumps({
            "disable": os.environ.get(cpu.ENV_DISABLE), "active": os.environ.get(cpu.ENV_ACTIVE),
            "pythonpath": os.environ["PYTHONPATH"].split(os.pathsep)[:2], "loaded_by_apply": loaded,
            "ray_init_wrapped": getattr(ray.init, "_openrlhf_dppo_cpu", False),
            "replay_buffer_patched": getattr(NaiveReplayBuffer.__init__, "_openrlhf_dppo_cpu", False),
            "current_device": str(torch.cuda.current_device()),
        }))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENRLHF_DPPO_")}
    env["PYTHONPATH"] = str(repo_root)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    from openrlhf_dppo.compat.flash_attn_stub import STUB_PATH

    assert out == {
        "disable": "device_mesh,plain_linear",  # the keyword turned the watchdog back on
        "active": "1",
        "pythonpath": [str(repo_root), STUB_PATH],
        "loaded_by_apply": [],  # host modules are patched after their import, never imported eagerly
        "ray_init_wrapped": True,
        "replay_buffer_patched": True,
        "current_device": "cpu",
    }


def test_importing_the_cpu_layer_loads_neither_torch_nor_the_host(repo_root):
    # every Ray worker imports it first (the setup hook); the host modules it patches load later, when the
    # host imports them
    code = "import sys, openrlhf_dppo.compat.cpu; print(sorted({m.split('.')[0] for m in sys.modules}))"
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    loaded = set(json.loads(res.stdout.strip().replace("'", '"')))
    assert not loaded & {"torch", "numpy", "ray", "deepspeed", "vllm", "openrlhf", "transformers"}
