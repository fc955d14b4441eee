"""The tiny task's reward file in OpenRLHF's ``reward_func`` contract (loaded by path, as the host does)."""

from __future__ import annotations

import importlib.util

import pytest
import torch


def _load(repo_root):
    spec = importlib.util.spec_from_file_location(
        "rf", repo_root / "openrlhf_dppo" / "rewards" / "arithmetic.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_arithmetic_reward_needs_the_exact_sum_then_eos(repo_root):
    mod = _load(repo_root)
    out = mod.reward_func(
        ["12+5=17<eos>", "12+5=17", "12+5=18<eos>", "9+9= 18<eos>", "3+4=7<eos><pad>"],
        ["12+5=", "12+5=", "12+5=", "9+9=", "3+4="],
        ["17", "17", "17", "18", "7"],
    )
    assert out["rewards"].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert torch.equal(out["scores"], out["rewards"])


@pytest.mark.parametrize("label", ["", r"\frac{1}{2}", '{"numbers": [4, 7], "target": 28}', "1 7"])
def test_a_label_that_is_not_a_sum_in_digits_is_refused_naming_the_field_and_the_format(repo_root, label):
    """Without --data.label_key OpenRLHF passes "" as every label: an empty answer would score 1.0."""
    mod = _load(repo_root)
    with pytest.raises(ValueError) as err:
        mod.reward_func(["<eos>"], [""], [label])
    message = str(err.value)
    assert repr(label) in message and "--data.label_key" in message and "in digits" in message, message
    assert mod.reward_func(["2+2=4<eos>"], ["2+2="], [4])["rewards"].tolist() == [
        1.0
    ]  # a number is its digits
