"""The tiny task's reward file in OpenRLHF's ``reward_func`` contract (loaded by path, as the host does)."""

from __future__ import annotations

import importlib.util

import torch


def test_arithmetic_reward_needs_the_exact_sum_then_eos(repo_root):
    spec = importlib.util.spec_from_file_location(
        "rf", repo_root / "openrlhf_dppo" / "rewards" / "arithmetic.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.reward_func(
        ["12+5=17<eos>", "12+5=17", "12+5=18<eos>", "9+9= 18<eos>", "3+4=7<eos><pad>"],
        ["12+5=", "12+5=", "12+5=", "9+9=", "3+4="],
        ["17", "17", "17", "18", "7"],
    )
    assert out["rewards"].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert torch.equal(out["scores"], out["rewards"])
