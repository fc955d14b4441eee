"""``--dppo.method greso``: refused before Ray without dynamic filtering (naming both flags) and under the
async trainer; accepted with dynamic filtering, as OpenRLHF's GRPO step (no packing forced on)."""

import pytest
from cli_commands import local_command, parse

from openrlhf_dppo.cli import train_dppo_ray as cli

GRESO = ["--dppo.method", "greso", "--algo.dynamic_filtering_enable"]


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv, train_fn=lambda a: pytest.fail("got past validation"), check_inputs=False)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_greso_without_dynamic_filtering_is_refused_naming_both_flags(tmp_path, capsys):
    err = _refused(local_command(tmp_path) + ["--dppo.method", "greso"], capsys)
    assert "--algo.dynamic_filtering_enable" in err and "--dppo.method greso" in err


def test_greso_under_the_async_trainer_is_refused(tmp_path, capsys):
    err = _refused(local_command(tmp_path) + GRESO + ["--train.async_enable"], capsys)
    assert "--train.async_enable" in err and "--dppo.method greso" in err


def test_greso_needs_rewards_on_the_rollouts(tmp_path, capsys):
    argv = local_command(tmp_path)
    i = argv.index("--reward.remote_url")
    err = _refused(argv[:i] + argv[i + 2 :] + GRESO + ["--reward.model_name_or_path", "rm"], capsys)
    assert "--reward.remote_url" in err and "--dppo.method greso" in err


def test_greso_with_dynamic_filtering_is_accepted_as_grpos_step(tmp_path):
    args = parse(local_command(tmp_path) + GRESO + ["--algo.dynamic_filtering_range", "0.01", "0.99"])
    assert args.dppo.method == "greso" and args.algo.dynamic_filtering_enable
    assert not args.train.dynamic_batch_enable  # GRPO's micro-batches: packing is DPPO's alone
