"""``--dppo.mode``: a preset names a flag set that fills in what the command line leaves unset (its own
flags win, abbreviated or not; a preset value they refuse is left out; nothing under --dppo.enable false),
and a DPPO run whose settings leave the first epoch (or everything) unpruned says so at start."""

import pytest
from cli_commands import GRPO, parse

from openrlhf_dppo.cli.flags import ModeChoice, apply_mode
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


def test_what_the_preset_set_is_recorded_as_flags_in_front_of_the_command_line(monkeypatch):
    from openrlhf.cli import train_ppo_ray

    import openrlhf_dppo.adapters as adapters
    from openrlhf_dppo.cli import train_dppo_ray as cli
    from openrlhf_dppo.compat import cpu

    seen = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cpu, "apply", lambda **kw: True)
    monkeypatch.setattr(adapters, "install", lambda cfg, run: seen.update(run=run))
    monkeypatch.setattr(train_ppo_ray, "train", lambda args: None)
    argv = GRPO + ["--dppo.mode", "recommended", "--dppo.unseen", "keep"]
    cli.main(argv, check_inputs=False)
    assert seen["run"].argv == [
        "--dppo.prompt_rate_control", "zero-share", "--dppo.prompt_prune_rate", "0.5",
        "--dppo.completion_prune_rate", "0.0", *argv,
    ]  # fmt: skip
    assert ModeChoice("recommended", {"prompt_prune_rate": 0.5}).flags() == [
        "--dppo.prompt_prune_rate",
        "0.5",
    ]
    # no preset, or custom: nothing set, no line
    flags = {"dppo.mode": "custom", "dppo.enable": True}
    assert apply_mode(flags, set(), lambda f: None) == (flags, None)


def test_an_unknown_mode_is_refused_by_the_parser_with_the_choices(capsys):
    with pytest.raises(SystemExit) as err:
        parse(GRPO + ["--dppo.mode", "fast"])
    assert err.value.code == 2
    assert (
        "--dppo.mode: invalid choice: 'fast' (choose from 'custom', 'recommended')" in capsys.readouterr().err
    )


def test_a_preset_value_the_command_lines_own_flags_refuse_is_left_out_not_refused(capsys):
    # the cap 0.4 is valid alone; the preset's first-draw rate 0.5 would exceed it: the rate keeps its
    # default (0: the first draw unpruned, then the measured share, capped at 0.4), and the line says why
    d = parse(GRPO + ["--dppo.mode", "recommended", "--dppo.prompt_prune_rate_max", "0.4"]).dppo
    assert (d.prompt_rate_control, d.prompt_prune_rate, d.prompt_prune_rate_max) == ("zero-share", 0.0, 0.4)
    assert d.unseen_prompts == "mean"
    out = capsys.readouterr().out
    assert "--dppo.prompt_prune_rate 0.5 left out (the field's default kept): --dppo.prompt_prune_rate" in out
    assert (
        "exceeds --dppo.prompt_rate_control" not in out
        and "0.5 exceeds --dppo.prompt_prune_rate_max 0.4" in out
    )
    # refill with Bernoulli draws is valid alone: zero-share (it needs shrink) and a prune rate (refill
    # prunes with systematic draws only) are both left out
    d = parse(
        GRPO + ["--dppo.mode", "recommended", "--dppo.prompt_batch", "refill", "--dppo.sampling", "bernoulli"]
    ).dppo
    assert (d.prompt_rate_control, d.prompt_prune_rate, d.unseen_prompts) == ("fixed", 0.0, "mean")
    out = capsys.readouterr().out
    assert (
        "--dppo.prompt_rate_control zero-share left out" in out
        and "--dppo.prompt_prune_rate 0.5 left out" in out
    )


def test_the_command_lines_own_bad_flag_is_reported_as_its_own(capsys):
    with pytest.raises(SystemExit) as err:
        parse(GRPO + ["--dppo.mode", "recommended", "--dppo.q_min", "0"])
    assert err.value.code == 2
    assert "error: --dppo.q_min: 0.0 must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "given", [["--dppo.unseen", "keep"], ["--dppo.unseen=keep"], ["--dppo.unseen_p", "keep"]]
)
def test_an_abbreviated_flag_wins_and_the_start_up_line_says_so(capsys, given):
    # OpenRLHF's parser takes abbreviations (argparse's allow_abbrev, on by default): the preset reads the
    # command line as that parser does
    d = parse(GRPO + ["--dppo.mode", "recommended", *given]).dppo
    assert d.unseen_prompts == "keep" and d.prompt_rate_control == "zero-share"
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[openrlhf-dppo] --dppo.mode")]
    assert "--dppo.unseen_prompts mean" not in line
    assert line.endswith("(the command line's own --dppo.unseen_prompts kept)")


def test_the_preset_sets_nothing_in_a_grpo_run_and_says_so(capsys):
    d = parse(GRPO + ["--dppo.mode", "recommended", "--dppo.enable", "false"]).dppo
    defaults = DPPOConfig()
    assert {k: getattr(d, k) for k in RECOMMENDED} == {k: getattr(defaults, k) for k in RECOMMENDED}
    out = capsys.readouterr().out
    assert "[openrlhf-dppo] --dppo.mode recommended: nothing set: --dppo.enable false runs GRPO" in out
    assert "zero-share" not in out


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
