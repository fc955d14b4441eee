"""``--dppo.method cppo``: refused before Ray without a completion prune rate (naming the flag and the
paper's 0.5), at a rate that prunes nothing of a group, and under the async trainer (naming both flags);
accepted otherwise, with DPPO's packed micro-batches turned on and a start-up line saying which flags do
not apply."""

import pytest
from cli_commands import local_command, parse

from openrlhf_dppo.cli import train_dppo_ray as cli

CPPO = ["--dppo.method", "cppo", "--dppo.completion_prune_rate", "0.5"]


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv, train_fn=lambda a: pytest.fail("got past validation"), check_inputs=False)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_cppo_without_a_completion_prune_rate_is_refused_naming_it(tmp_path, capsys):
    err = _refused(local_command(tmp_path) + ["--dppo.method", "cppo"], capsys)
    assert "--dppo.completion_prune_rate" in err and "--dppo.method cppo" in err and "0.5" in err


def test_cppo_at_a_rate_that_prunes_nothing_of_a_group_is_refused(tmp_path, capsys):
    # groups of 4 at 0.2: int(4 x 0.2) = 0 completions pruned
    err = _refused(
        local_command(tmp_path) + ["--dppo.method", "cppo", "--dppo.completion_prune_rate", "0.2"], capsys
    )
    assert "--dppo.completion_prune_rate" in err and "--rollout.n_samples_per_prompt 4" in err


def test_cppo_under_the_async_trainer_is_refused_naming_both_flags(tmp_path, capsys):
    err = _refused(local_command(tmp_path) + CPPO + ["--train.async_enable"], capsys)
    assert "--train.async_enable" in err and "--dppo.method cppo" in err


def test_cppo_is_accepted_with_packing_on_and_says_what_does_not_apply(tmp_path, capsys):
    args = parse(local_command(tmp_path) + CPPO)
    assert args.dppo.method == "cppo" and args.dppo.completion_prune_rate == 0.5
    assert args.train.dynamic_batch_enable  # DPPO's packed plan trains CPPO's kept completions
    out = capsys.readouterr().out
    assert "CPPO (biased by design)" in out and "--dppo.prompt_prune_rate" in out and "--dppo.p_min" in out


def test_cppo_needs_dppos_requirements_too(tmp_path, capsys):
    argv = local_command(tmp_path)
    i = argv.index("--vllm.num_engines")
    err = _refused(argv[:i] + ["--vllm.num_engines", "0"] + argv[i + 2 :] + CPPO, capsys)
    assert "--vllm.num_engines" in err
