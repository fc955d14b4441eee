"""Parity with OpenRLHF: its example command lines (``openrlhf_examples``) through its own parser and ours.

For every example, with its paths replaced by small local files:
- OpenRLHF 0.11.2's main block parses and validates it as the script would (``parser.parse_args()`` on
  ``sys.argv``; only the final ``train(args)`` is replaced by a capture, so Ray never starts);
- ``train_dppo_ray --dppo.method grpo`` accepts it (the input checks on) and produces the same namespace,
  less the ``dppo`` group (async training included) -- or, for an example the baseline refuses, refuses it
  naming the flag, for the reason FLAGS.md documents;
- DPPO (the defaults, and a fixed prompt rate) accepts it, changing only what turning on the packed
  micro-batches changes (and prints what it runs differently from the command's look, e.g. a rollout longer
  than a micro-batch trained alone), or refuses it with status 2 and a message that names the flag and the
  documented reason.
"""

from __future__ import annotations

import re

import pytest
from cli_commands import ROOT, parse
from openrlhf_examples import EXAMPLES, SOURCE_VERSION, Example, example_id, flat, materialize, openrlhf_parse

from openrlhf_dppo.cli import train_dppo_ray as cli

#: what DPPO may change in OpenRLHF's namespace: it turns on --train.dynamic_batch_enable, and OpenRLHF's
#: validation derives the rest from that (see train_dppo_ray's docstring)
DPPO_TURNS_ON = {"train.dynamic_batch_enable", "ds.packing_samples", "rollout.max_tokens_per_gpu",
                 "ds.attn_implementation"}  # fmt: skip


def comparable(ns) -> dict:
    """The flat namespace, less the wandb run name: its default is the parse time to the minute, so two
    parses a minute boundary apart differ there (no example sets it)."""
    out = flat(ns)
    assert re.fullmatch(r"ppo_\d{4}T\d\d:\d\d", out.pop("logger.wandb.run_name"))
    return out


def refusal(argv: list[str], capsys) -> str:
    called = []
    with pytest.raises(SystemExit) as exc:
        cli.main(argv, train_fn=called.append, check_inputs=True)
    assert exc.value.code == 2 and not called
    return capsys.readouterr().err


def test_dppo_accepts_openrlhfs_long_context_reinforce_examples():
    """OpenRLHF runs them with --data.max_len 74,240 over a micro-batch's 32,384 tokens (a longer sequence
    in a micro-batch of its own); DPPO accepts them in the same way and says so at start."""
    long_context = [e for e in EXAMPLES if e.name == "train_reinforce_baseline_hybrid_engine.sh"]
    assert len(long_context) == 2 and all(e.dppo is None and e.dppo_notice for e in long_context)
    dppo_refusals = {e.dppo for e in EXAMPLES if e.dppo}
    assert "--data.max_len" not in dppo_refusals


def test_the_examples_cover_the_grpo_dapo_reinforce_prorl_and_slurm_scripts():
    names = {e.name for e in EXAMPLES}
    assert len(EXAMPLES) >= 8 and len({example_id(e) for e in EXAMPLES}) == len(EXAMPLES)
    for script in ("train_dapo_ray_hybrid_engine.sh", "train_prorlv2_math_hybrid_engine.sh",
                   "train_reinforce_baseline_hybrid_engine.sh", "train_reinforce_baseline_ray_agent_async.sh",
                   "train_ppo_ray_slurm.sh"):  # fmt: skip
        assert script in names
    estimators = {e.argv[e.argv.index("--algo.advantage.estimator") + 1] for e in EXAMPLES
                  if "--algo.advantage.estimator" in e.argv}  # fmt: skip
    assert {"group_norm", "reinforce_baseline"} <= estimators
    assert SOURCE_VERSION.startswith("v0.11")


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_the_baseline_gives_openrlhfs_namespace_or_refuses_by_name(example: Example, tmp_path, capsys):
    argv = materialize(example, tmp_path)
    host = comparable(openrlhf_parse(argv))  # OpenRLHF accepts every example
    off = argv + ["--dppo.method", "grpo"]
    if example.baseline is None:
        ours = comparable(parse(off, check_inputs=True))
        assert ours.pop("dppo.method") == "grpo"
        assert {k: v for k, v in ours.items() if not k.startswith("dppo.")} == host
    else:
        err = refusal(off, capsys)
        assert f"error: {example.baseline}: " in err and example.baseline_reason in err


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_dppo_accepts_the_example_or_refuses_it_by_name_for_a_documented_reason(
    example: Example, tmp_path, capsys
):
    argv = materialize(example, tmp_path)
    if example.dppo is None:
        host = comparable(openrlhf_parse(argv))
        capsys.readouterr()
        ours = comparable(parse(argv, check_inputs=True))
        if example.dppo_notice:  # said at start, as one line
            assert any(example.dppo_notice in line for line in capsys.readouterr().out.splitlines())
        assert ours["dppo.method"] == "dppo" and ours["train.dynamic_batch_enable"] is True
        ours = {k: v for k, v in ours.items() if not k.startswith("dppo.")}
        assert ours.keys() == host.keys()
        assert {k for k in host if ours[k] != host[k]} <= DPPO_TURNS_ON
        # what a user would add: a fixed prompt rate changes DPPO's flags only
        fixed = comparable(parse(argv + ["--dppo.prompt_rate_control", "fixed"], check_inputs=True))
        assert fixed["dppo.prompt_rate_control"] == "fixed"
        assert {k: v for k, v in fixed.items() if not k.startswith("dppo.")} == ours
    else:
        err = refusal(argv, capsys)
        assert f"error: {example.dppo}: " in err and example.dppo_reason in err


@pytest.mark.parametrize("reason", sorted({e.dppo_reason for e in EXAMPLES if e.dppo} |
                                          {e.baseline_reason for e in EXAMPLES if e.baseline}))  # fmt: skip
def test_every_expected_refusal_is_a_documented_reason(reason):
    """The refusals the examples meet are the ones README.md / docs/FLAGS.md state."""
    docs = " ".join(((ROOT / "README.md").read_text() + (ROOT / "docs" / "FLAGS.md").read_text()).split())
    documented = {
        "a critic (GAE) needs every sequence": "a critic needs every sequence",
        "does not support for vision-language models": "no images",
    }
    assert documented[reason] in docs
