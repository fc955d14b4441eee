"""End to end: CPPO (``--dppo.method cppo``, the biased peer) through ``python -m
openrlhf_dppo.cli.train_dppo_ray`` on CPU, the tiny run of test_tiny_pipeline.py.

At --dppo.completion_prune_rate 0.5 a step draws int(8 / 0.5) = 16 prompts (the whole data set, so one
step per episode; 2 episodes, 2 steps), rolls all 16 out (none pruned at the prompt level), keeps the 2
completions of largest |A| of each group of 4 at weight 1 and trains them: 32 completions, one train
batch, GRPO's update size. Checked per step: the draw, half the completions pruned, the accounting
identity, every weight 1, the normalisers over the kept completions, one optimizer step; and the run
directory's ``algo``. About 2 minutes on 2 cores once the tiny assets are built.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tiny_pipeline import (  # noqa: E402
    PROMPTS,
    SAMPLES,
    check_syncs,
    check_token_accounting,
    common_flags,
    run_cli,
    tiny,
    train_rows,
)

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets

CPPO_FLAGS = ["--dppo.method", "cppo", "--dppo.completion_prune_rate", "0.5"]


@pytest.fixture(scope="module")
def cppo_run(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cppo"))
    return run_cli(out, common_flags(out, episodes=2) + CPPO_FLAGS)


def test_cppo_draws_twice_the_batch_prunes_half_the_completions_at_weight_one(cppo_run):
    rows = train_rows(cppo_run)
    assert [r["step"] for r in rows] == [1, 2]
    check_token_accounting(rows)
    drawn = 2 * PROMPTS  # int(B / (1 - 0.5))
    for r in rows:
        assert (
            r["prompts/drawn"] == drawn and r["prompts/rolled_out"] == drawn and r["prompts/pruned"] == 0
        ), r
        assert r["dppo/prompt_keep_frac"] == 1.0
        generated = drawn * SAMPLES
        assert r["samples/generated"] == generated and r["samples/filtered"] == 0
        assert r["samples/pruned"] == generated / 2 and r["dppo/completion_keep_frac"] == 0.5, r
        # no reweighting: every kept completion trains at weight 1
        assert r["dppo/weight_mean"] == 1.0 and r["dppo/weight_max"] == 1.0, r
        # a mean over the kept completions: their count and tokens
        kept_tokens = r["tokens/generated"] - r["tokens/pruned"]
        assert r["dppo/normalizer_seqs"] == generated / 2 and r["dppo/normalizer_tokens"] == kept_tokens, r
        assert r["dppo/completion_zero_prob_frac"] == 0.0  # CPPO keeps its top k, A == 0 or not
        # GRPO's update size: the kept 32 completions are one --train.batch_size batch
        assert r["dppo/optimizer_steps"] == 1.0, r
        assert r["samples/trained"] + r.get("samples/fillers", 0.0) >= 1
    check_syncs(cppo_run, expected=2)
    config = json.load(open(os.path.join(cppo_run["out"], "run_config.json")))
    assert config["algo"] == "cppo"
    status = json.load(open(os.path.join(cppo_run["out"], "status.json")))
    assert status["state"] == "finished" and status["step"] == 2
