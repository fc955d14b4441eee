"""``--dppo.mode``: a preset names a flag set, expanded in front of the command line (its own flags win),
and a DPPO run whose settings leave the first epoch (or everything) unpruned says so at start."""

import pytest
from cli_commands import GRPO, parse

from openrlhf_dppo.cli.flags import expand_mode
from openrlhf_dppo.core import DPPOConfig
from openrlhf_dppo.core.config import MODE_PRESETS

RECOMMENDED = {
    "prompt_rate_control": "zero-share",
    "prompt_prune_rate": 0.5,
    "unseen_prompts": "mean",
    "completion_prune_rate": 0.0,
}


def test_recommended_expands_to_zero_share_with_unseen_prompts_drawn_and_no_completion_pruning(capsys):
    assert MODE_PRESETS["recommended"] == RECOMMENDED
    d = parse(GRPO + ["--dppo.mode", "recommended"]).dppo
    assert d.mode == "recommended"
    assert {k: getattr(d, k) for k in RECOMMENDED} == RECOMMENDED
    out = capsys.readouterr().out
    assert "[openrlhf-dppo] --dppo.mode recommended: --dppo.prompt_rate_control zero-share" in out
    assert "unseen_prompts keep" not in out and "prunes no prompt and no completion" not in out


def test_a_flag_the_command_line_gives_wins_over_the_preset_wherever_it_stands(capsys):
    for argv in (
        ["--dppo.completion_prune_rate", "0.3", "--dppo.mode", "recommended"],
        ["--dppo.mode=recommended", "--dppo.completion_prune_rate", "0.3"],
    ):
        d = parse(GRPO + argv).dppo
        assert d.completion_prune_rate == 0.3 and d.prompt_rate_control == "zero-share"
        assert "the command line's own --dppo.completion_prune_rate kept" in capsys.readouterr().out


def test_the_expanded_flags_are_in_the_recorded_command_line():
    argv, note = expand_mode(["--x", "1", "--dppo.mode", "recommended"])
    assert argv[:8] == [
        "--dppo.prompt_rate_control", "zero-share", "--dppo.prompt_prune_rate", "0.5",
        "--dppo.unseen_prompts", "mean", "--dppo.completion_prune_rate", "0.0",
    ]  # fmt: skip
    assert argv[8:] == ["--x", "1", "--dppo.mode", "recommended"] and note
    assert expand_mode(["--dppo.mode", "custom", "--y"]) == (["--dppo.mode", "custom", "--y"], None)
    assert expand_mode(["--dppo.mode", "recommended", "--dppo.mode", "custom"])[1] is None  # the last wins


def test_an_unknown_mode_is_refused_by_the_parser_with_the_choices(capsys):
    with pytest.raises(SystemExit) as err:
        parse(GRPO + ["--dppo.mode", "fast"])
    assert err.value.code == 2
    assert (
        "--dppo.mode: invalid choice: 'fast' (choose from 'custom', 'recommended')" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "flags, says",
    [
        ([], "prunes no prompt and no completion"),
        (["--dppo.prompt_prune_rate", "0.5"], "the first epoch prunes no prompt"),
        (["--dppo.prompt_rate_control", "zero-share"], "the first epoch prunes no prompt"),
        (["--dppo.completion_prune_rate", "0.5"], None),
        (["--dppo.prompt_prune_rate", "0.5", "--dppo.unseen_prompts", "mean"], None),
        (["--dppo.enable", "false"], None),
    ],
)
def test_settings_that_leave_the_first_epoch_unpruned_say_so_at_start(capsys, flags, says):
    parse(GRPO + flags)
    out = capsys.readouterr().out
    if says is None:
        assert "prunes no prompt" not in out
    else:
        assert says in out


def test_notices_come_from_the_config_alone():
    assert DPPOConfig(enable=False).notices() == []
    assert len(DPPOConfig().notices()) == 1
    assert DPPOConfig(**RECOMMENDED).notices() == []
