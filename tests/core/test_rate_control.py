"""PromptRateControl (``--dppo.prompt_rate_control``): the rate of each draw, by hand; its state goes
through a checkpoint. (Its unbiasedness: test_unbiased.py; through the trainer: tests/adapters.)"""

import math

import pytest
import torch

from openrlhf_dppo.core import ZERO_SHARE_CAP, DPPOConfig, PromptRateControl


def test_fixed_ignores_the_measured_share():
    c = PromptRateControl.from_config(DPPOConfig(prompt_rate_control="fixed", prompt_prune_rate=0.4))
    for u in (0.0, 0.9, 1.7):
        c.observe(u)
        assert c.rate() == 0.4
    assert c.share is None


def test_zero_share_starts_at_the_configured_rate_then_follows_the_moving_average_by_hand():
    cfg = DPPOConfig(prompt_rate_control="zero-share", prompt_prune_rate=0.3)
    c = PromptRateControl.from_config(cfg)
    assert c.cap == ZERO_SHARE_CAP == 0.7
    assert c.rate() == 0.3  # nothing measured yet
    c.observe(0.5)
    assert c.rate() == 0.5  # the first measurement is taken as it is
    c.observe(0.25)
    assert c.rate() == pytest.approx(0.8 * 0.5 + 0.2 * 0.25)  # 0.45
    c.observe(1.9)  # an HT share above 1: averaged as it is, not clipped
    assert c.share == pytest.approx(0.8 * 0.45 + 0.2 * 1.9)  # 0.74
    assert c.rate() == 0.7  # the cap
    c.observe(0.0)
    c.observe(0.0)
    assert c.rate() == pytest.approx(0.74 * 0.8**2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1])
def test_zero_share_refuses_a_share_that_is_not_a_finite_number_at_least_0(bad):
    c = PromptRateControl(mode="zero-share")
    with pytest.raises(ValueError, match="all-equal share must be a finite number >= 0"):
        c.observe(bad)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "pid"}, "unknown prompt rate control 'pid'; valid: fixed, zero-share"),
        ({"initial": 1.0}, r"initial must be a prune rate in \[0, 1\)"),
        ({"cap": -0.1}, r"cap must be a prune rate in \[0, 1\)"),
        ({"smoothing": 1.0}, r"smoothing must be in \[0, 1\)"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PromptRateControl(**kwargs)


def test_state_round_trips_through_torch_save_and_a_mode_change_is_refused(tmp_path):
    c = PromptRateControl(mode="zero-share", initial=0.2)
    c.observe(0.35)
    c.observe(0.55)
    torch.save(c.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    resumed = PromptRateControl(mode="zero-share", initial=0.2)
    resumed.load_state_dict(state)
    assert resumed.rate() == c.rate() == pytest.approx(0.8 * 0.35 + 0.2 * 0.55)
    with pytest.raises(ValueError, match="resume with the same --dppo.prompt_rate_control"):
        PromptRateControl(mode="fixed").load_state_dict(state)
    with pytest.raises(ValueError, match="unsupported PromptRateControl state version"):
        resumed.load_state_dict({**state, "version": 0})
