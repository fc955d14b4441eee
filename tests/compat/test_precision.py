"""The CPU precision: chosen from what oneDNN reports about the CPU, overridden by the environment or the
flag, refused with the variable's name when bad; the patches that let OpenRLHF run it; the machine record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from openrlhf_dppo import precision, run_dir
from openrlhf_dppo.cli import train_dppo_ray as cli
from openrlhf_dppo.compat import cpu
from openrlhf_dppo.compat.cpu import dtype, hooks

EMULATE_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.fixture(autouse=True)
def no_precision_env(monkeypatch):
    for name in (precision.ENV, *precision.ISA_CAPS):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def onednn_bf16(monkeypatch):
    """Set what torch's oneDNN reports about bf16 on this CPU."""

    def set_to(value: bool):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: value)

    return set_to


def test_auto_follows_what_onednn_reports_about_the_cpu(onednn_bf16):
    onednn_bf16(True)
    assert precision.cpu_native_bf16() is True and precision.resolve() == "bf16"
    onednn_bf16(False)
    assert precision.cpu_native_bf16() is False and precision.resolve() == "fp32"
    assert precision.resolve("auto") == precision.resolve("") == "fp32"


def test_the_environment_overrides_the_cpu(onednn_bf16, monkeypatch):
    onednn_bf16(False)
    monkeypatch.setenv(precision.ENV, "BF16")
    assert precision.resolve() == "bf16"
    onednn_bf16(True)
    monkeypatch.setenv(precision.ENV, "fp32")
    assert precision.resolve() == "fp32"


def test_a_bad_value_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(precision.ENV, "fp64")
    with pytest.raises(
        precision.PrecisionError,
        match=r"OPENRLHF_DPPO_CPU_PRECISION='fp64': expected one of auto, bf16, fp32",
    ):
        precision.resolve()
    with pytest.raises(precision.PrecisionError, match=r"^PRECISION='half': expected"):
        precision.resolve("half", name="PRECISION")


def _helper(env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in (precision.ENV, *precision.ISA_CAPS)}
    env.update(env_extra, PYTHONPATH=root)
    cmd = [sys.executable, "-m", "openrlhf_dppo.precision", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_the_emulated_avx2_cpu_is_seen_without_native_bf16():
    # real oneDNN, no mock: ONEDNN_MAX_CPU_ISA=AVX2 takes its bf16 kernels away on any x86 CPU
    res = _helper(EMULATE_AVX2, "--explain")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "fp32"
    assert "no native bf16 (oneDNN), torch CPU capability AVX2" in res.stderr
    res = _helper({})  # this CPU as it is
    assert res.stdout.strip() == ("bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32")


def test_the_helper_refuses_a_bad_value_under_the_name_it_is_given():
    res = _helper({}, "fp64", "--name", "PRECISION")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().endswith("error: PRECISION='fp64': expected one of auto, bf16, fp32")


# ---- the CLI: --ds.param_dtype on CPU ---------------------------------------------------------------
def parse(argv: list[str]):
    """``--ds.param_dtype`` as the CLI resolves it (stops before Ray)."""
    args = cli.main(
        [*argv, "--dppo.method", "grpo", "--reward.remote_url", "r.py", "--actor.model_name_or_path", "m"],
        train_fn=lambda a: a,
    )
    return args.ds.param_dtype


def test_on_cpu_the_flag_defaults_to_the_cpus_choice_and_wins_when_given(onednn_bf16, monkeypatch):
    onednn_bf16(False)
    assert parse([]) == "fp32"
    assert parse(["--ds.param_dtype", "bf16"]) == "bf16"
    onednn_bf16(True)
    assert parse([]) == "bf16"
    assert parse(["--ds.param_dtype", "fp32"]) == "fp32"
    monkeypatch.setenv(precision.ENV, "fp32")
    assert parse([]) == "fp32"


def test_a_bad_environment_value_stops_the_cli_before_ray_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv(precision.ENV, "fp8")
    with pytest.raises(SystemExit) as err:
        parse([])
    assert err.value.code == 2
    assert (
        "error: OPENRLHF_DPPO_CPU_PRECISION='fp8': expected one of auto, bf16, fp32"
        in capsys.readouterr().err
    )


def test_on_gpu_the_flag_is_openrlhfs_own(onednn_bf16, monkeypatch, capsys):
    onednn_bf16(False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parse([]) == "bf16"  # OpenRLHF's default, whatever the CPU
    with pytest.raises(SystemExit):
        parse(["--ds.param_dtype", "fp32"])
    assert "invalid choice: 'fp32'" in capsys.readouterr().err


# ---- the patches -----------------------------------------------------------------------------------
def test_openrlhfs_dtype_table_learns_fp32_and_keeps_the_rest(monkeypatch):
    module = types.SimpleNamespace(convert_to_torch_dtype=lambda d: {"bf16": torch.bfloat16}[d])
    monkeypatch.setattr(hooks, "after_import", lambda name, cb: cb(module))
    monkeypatch.setattr(dtype, "after_import", hooks.after_import)
    dtype.patch_fp32_param_dtype()
    assert module.convert_to_torch_dtype("fp32") is torch.float32
    assert module.convert_to_torch_dtype("bf16") is torch.bfloat16


class _Actor:
    """Stands in for ``RolloutRayActor``: records the keyword arguments an engine is made with."""

    made: list[dict] = []

    @classmethod
    def options(cls, **options):
        return types.SimpleNamespace(remote=lambda *a, **kw: cls.made.append(kw))


@pytest.mark.parametrize("value, expected", [("fp32", "float32"), ("bf16", "bfloat16"), (None, "bfloat16")])
def test_the_engine_is_built_in_the_runs_precision(monkeypatch, value, expected):
    from openrlhf_dppo.compat.cpu import weight_sync

    module = types.SimpleNamespace(RolloutRayActor=_Actor)
    monkeypatch.setattr(weight_sync, "after_import", lambda name, cb: cb(module))
    if value:
        monkeypatch.setenv(precision.ENV, value)
    _Actor.made = []
    weight_sync.patch_worker_extension()
    dtype.patch_engine_dtype()
    module.RolloutRayActor.options(num_cpus=1).remote(dtype="bfloat16", worker_extension_cls="theirs", seed=3)
    assert _Actor.made == [
        {
            "dtype": expected,  # OpenRLHF's own bfloat16 when no precision was resolved
            "worker_extension_cls": weight_sync.EXTENSION_CLS,
            "worker_cls": weight_sync.WORKER_CLS,
            "seed": 3,
        }
    ]


def test_importing_the_vllm_worker_patches_nothing_and_building_it_does(repo_root):
    code = (
        "import json, torch\n"
        "from openrlhf_dppo.compat import cpu\n"
        "from openrlhf_dppo.compat import vllm_worker as vw\n"
        "before = getattr(torch.cuda, '_openrlhf_dppo_cpu', False)\n"
        "calls = []\n"
        "vw.install = lambda site: calls.append(site)\n"
        "vw.CPUWorker.__init__ = lambda self, *a, **k: calls.append('vllm CPUWorker.__init__')\n"
        "vw.CPUEngineWorker(vllm_config=None, local_rank=0, rank=0, distributed_init_method='x')\n"
        "print(json.dumps({'patched_on_import': before, 'calls': calls}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"patched_on_import": False, "calls": [cpu.patches.VLLM_ENGINE, "vllm CPUWorker.__init__"]}


def test_apply_prints_the_choice_and_hands_it_to_the_workers(monkeypatch, capsys):
    monkeypatch.setattr(cpu, "install", lambda site: [])
    monkeypatch.setattr(cpu, "wrap_ray_init", lambda *a, **k: None)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    for name in ("VLLM_CPU_KVCACHE_SPACE", "TOKENIZERS_PARALLELISM", cpu.ENV_ACTIVE):
        monkeypatch.setenv(name, os.environ.get(name, "x"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cpu.apply(precision="fp32") is True
    assert os.environ[precision.ENV] == "fp32"
    log = capsys.readouterr().err
    assert (
        "CPU precision fp32 (OPENRLHF_DPPO_CPU_PRECISION=auto;" in log
        and "capped by ONEDNN_MAX_CPU_ISA=AVX2" in log
    )
    from openrlhf_dppo.compat.cpu.ray_init import WORKER_ENV

    assert {precision.ENV, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"} <= set(WORKER_ENV)


# ---- the machine record -----------------------------------------------------------------------------
def test_the_run_directory_records_the_machine(tmp_path, onednn_bf16, monkeypatch):
    onednn_bf16(False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    machine = precision.machine("fp32", "cpu")
    args = types.SimpleNamespace(ds=types.SimpleNamespace(param_dtype="fp32"))
    config = types.SimpleNamespace(asdict=lambda: {})
    run_dir.RunDir(tmp_path).write_config(args, config, "grpo", [], None, machine=machine)
    record = json.loads((tmp_path / run_dir.RUN_CONFIG).read_text())[run_dir.MACHINE]
    assert list(record) == [*run_dir.MACHINE_FIELDS, run_dir.MACHINE_ISA_CAPS]
    assert record["precision"] == "fp32" and record["cpu_native_bf16"] is False and record["device"] == "cpu"
    assert record["cpu_model"] == precision.cpu_model() and record["cpu_model"]
    assert record["torch_cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    assert record["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_the_machine_record_names_the_workers_device_not_the_writers(monkeypatch):
    # the trainer actor writes the record and holds no GPU on a GPU run (Ray blanks CUDA_VISIBLE_DEVICES
    # for it): the device is the driver's decision, passed in, whatever this process's torch sees
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.machine("bf16", "cuda")[run_dir.MACHINE_DEVICE] == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert precision.machine("fp32", "cpu")[run_dir.MACHINE_DEVICE] == "cpu"
    with pytest.raises(ValueError, match=r"^device=None: expected one of cpu, cuda \(RunMeta.device"):
        precision.machine("bf16", None)
