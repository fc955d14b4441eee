"""DPPOConfig: defaults, every rejection names its field and says what is expected, namespace construction."""

import argparse
import dataclasses

import pytest

from openrlhf_dppo.core import METHODS, PROMPT_POLICIES, RATE_CONTROLS, ZERO_SHARE_CAP, DPPOConfig
from openrlhf_dppo.core.config import DPPOConfigError


def test_defaults_match_design():
    c = DPPOConfig()
    assert c.asdict() == {
        "method": "dppo",
        "prompt_prune_rate": 0.5,  # zero-share's first draw
        "prompt_rate_control": "zero-share",
        "prompt_policy": "proportional",
        "completion_prune_rate": 0.0,
        "q_min": 0.1,
        "p_min": 0.1,
        "seed": 42,
        "short_batch": "drop",  # OpenRLHF's rule: whole train batches only
    }
    assert c.prompt_keep_frac == 0.5 and c.completion_keep_frac == 1.0
    assert ZERO_SHARE_CAP == 0.7
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.seed = 1  # type: ignore[misc]


FIXED = {"prompt_rate_control": "fixed"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({**FIXED, "prompt_prune_rate": 1.0}, r"--dppo.prompt_prune_rate 1.0: expected a rate in \[0, 1\)"),
        ({"completion_prune_rate": -0.1}, r"--dppo.completion_prune_rate -0.1: expected a rate in \[0, 1\)"),
        ({"q_min": 0.0}, r"--dppo.q_min 0.0: expected a value in \(0, 1\]"),
        ({"p_min": 1.5}, r"--dppo.p_min 1.5: expected a value in \(0, 1\]"),
        (
            {"completion_prune_rate": 0.95, "p_min": 0.1},
            r"--dppo.p_min 0.1: expected at most 1 - --dppo.completion_prune_rate = 0.05",
        ),
        (
            {**FIXED, "prompt_prune_rate": 0.95},
            r"--dppo.q_min 0.1: expected at most 1 - --dppo.prompt_prune_rate = 0.05",
        ),
        ({"seed": "x"}, "--dppo.seed 'x': expected an integer"),
        ({"prompt_policy": "sqrt"}, "--dppo.prompt_policy 'sqrt': expected one of: proportional, uniform"),
        (
            {"prompt_rate_control": "pid"},
            "--dppo.prompt_rate_control 'pid': expected one of: fixed, zero-share",
        ),
        ({"short_batch": "pad"}, "--dppo.short_batch 'pad': expected one of: drop, train"),
        (
            {"prompt_prune_rate": 0.8},
            "--dppo.prompt_prune_rate 0.8: expected at most 0.7 under --dppo.prompt_rate_control zero-share",
        ),
        ({"q_min": 0.4}, r"--dppo.q_min 0.4: expected at most 1 - zero-share's highest rate = 0.3"),
        ({"method": "ppo"}, "--dppo.method 'ppo': expected one of: grpo, dppo"),
        ({"method": True}, "--dppo.method True: expected one of: grpo, dppo"),
    ],
)
def test_rejections_name_the_field_and_what_is_expected(kwargs, match):
    with pytest.raises(DPPOConfigError, match=match) as exc:
        DPPOConfig(**kwargs)
    # the error carries the field, so the CLI names the flag without reading the message
    assert str(exc.value) == f"--dppo.{exc.value.field} {exc.value.value!r}: {exc.value.reason}"
    assert exc.value.field == match.split(" ")[0].removeprefix("--dppo.")
    assert isinstance(exc.value, ValueError)


def test_valid_pruning_setup():
    c = DPPOConfig(**FIXED, prompt_prune_rate=0.5, completion_prune_rate=0.9, p_min=0.1, q_min=0.05)
    assert c.completion_keep_frac == pytest.approx(0.1) and c.prompt_keep_frac == 0.5


def test_the_zero_share_cap_binds_only_the_controlled_rate():
    # fixed: the cap is not used, so a rate above it (and a q_min above 1 - cap) is valid
    c = DPPOConfig(**FIXED, prompt_prune_rate=0.8, q_min=0.2)
    assert c.prompt_keep_frac == pytest.approx(0.2)
    c = DPPOConfig(prompt_prune_rate=0.7, q_min=0.3)  # zero-share at its cap and the largest floor
    assert c.q_min == 0.3


def test_notices_say_when_nothing_is_pruned():
    assert (
        DPPOConfig().notices() == []
        and DPPOConfig(method="grpo", **FIXED, prompt_prune_rate=0).notices() == []
    )
    (line,) = DPPOConfig(**FIXED, prompt_prune_rate=0.0).notices()
    assert "prunes no prompt and no completion" in line


def test_from_namespace_flat_nested_and_dict():
    flat = argparse.Namespace(prompt_prune_rate=0.3, run_dir="/tmp/x", seed=None)
    c = DPPOConfig.from_namespace(flat)
    assert c.prompt_prune_rate == 0.3 and c.seed == 42  # None -> default
    nested = argparse.Namespace(dppo=argparse.Namespace(prompt_policy="uniform"), lr=1e-6)
    assert DPPOConfig.from_namespace(nested).prompt_policy == "uniform"
    assert DPPOConfig.from_namespace({"q_min": 0.2}).q_min == 0.2
    assert DPPOConfig.from_namespace(c.asdict()) == c
    # an old run's config or checkpoint: enable true/false and no method
    assert DPPOConfig.from_namespace({"enable": False}).method == "grpo"
    assert DPPOConfig.from_namespace({"enable": True, "q_min": 0.2}).method == "dppo"


def test_every_field_has_help_and_the_choice_fields_name_their_source():
    for f in dataclasses.fields(DPPOConfig):
        assert f.metadata.get("help"), f.name
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(DPPOConfig) if f.metadata["choices"]}
    assert set(choices) == {"method", "prompt_rate_control", "prompt_policy", "short_batch"}
    assert choices["method"] is METHODS and METHODS[:2] == ("grpo", "dppo")
    assert choices["prompt_policy"] is PROMPT_POLICIES and choices["prompt_rate_control"] is RATE_CONTROLS
