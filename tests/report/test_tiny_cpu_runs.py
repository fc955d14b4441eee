"""compare on run directories written by the real OpenRLHF pipeline on CPU (tests/report/data/tiny_cpu).

Two 2-step runs of `openrlhf_dppo.cli.train_dppo_ray` on this machine, copied without the model
weights: `grpo` (--dppo.method grpo, the embedded tiny model) and `dppo` (r_q .25, r_o .5, a
randomly initialised tiny model whose rewards are all 0, so every completion has A = 0 and is dropped
exactly). They were NOT run with the same model and data, which the report must say. The expected
numbers are read from the metric lines below with plain arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_dppo.cli.main import main
from openrlhf_dppo.report import Settings, build_report, load_run

DATA = Path(__file__).parent / "data" / "tiny_cpu"


def _lines(name):
    return [json.loads(line) for line in (DATA / name / "metrics.jsonl").read_text().splitlines()]


def test_real_runs_load():
    grpo, dppo = load_run(DATA / "grpo"), load_run(DATA / "dppo")
    assert (grpo.algo, grpo.state, len(grpo.train)) == ("grpo", "finished", 2)
    assert (dppo.algo, dppo.state, len(dppo.train)) == ("dppo", "finished", 2)
    assert grpo.notes == [] and dppo.notes == []


def test_real_runs_speedups_by_hand():
    g, d = _lines("grpo"), _lines("dppo")
    rep = build_report([load_run(DATA / "grpo"), load_run(DATA / "dppo")], Settings(warmup=1))
    c = rep.comparisons[0]
    # warm-up 1 of 2 steps: the medians are the step-2 values
    assert c.step_speedup == pytest.approx(g[1]["timing/step_total"] / d[1]["timing/step_total"], rel=1e-12)
    f = g[1]["timing/generation"] / g[1]["timing/step_total"]
    assert c.f == pytest.approx(f, rel=1e-12)
    # measured: every prompt kept (all unseen), no completion kept (all A = 0): r_q = 0, r_o = 1,
    # so the ideal ratio is (1 - 0) * (f + (1 - f) * 0) = f
    assert (d[1]["dppo/prompt_keep_frac"], d[1]["dppo/completion_keep_frac"]) == (1.0, 0.0)
    assert (c.r_q, c.r_o) == (0.0, 1.0)
    assert c.ideal_ratio == pytest.approx(f, rel=1e-12)
    assert rep.summaries[1].configured_rates == (0.25, 0.5)
    # GRPO's final smoothed reward (window 5 -> mean of both steps); DPPO's rewards are 0
    target = (g[0]["rollout/reward_mean"] + g[1]["rollout/reward_mean"]) / 2
    assert rep.summaries[0].final_reward == pytest.approx(target, rel=1e-12)
    # on the training-time axis (these runs predate time/train_s: the cumulative step time)
    assert rep.summaries[0].train_time == g[0]["timing/step_total"] + g[1]["timing/step_total"]
    # no held-out eval in either run: no held-out target, no matched-accuracy ratio
    assert rep.target is None and c.ttt_ratio is None
    # start-up before the first step: wall_time(1) - step_total(1)
    assert rep.summaries[0].startup == pytest.approx(g[0]["wall_time"] - g[0]["timing/step_total"], rel=1e-12)
    # tokens: generated = trained + pruned on every DPPO step
    totals = rep.summaries[1].totals
    assert (
        totals["tokens/generated"]
        == totals["tokens/trained"] + totals["tokens/pruned"]
        == sum(line["tokens/generated"] for line in d)
    )
    # the two runs used different models and datasets: flagged, with the packing args apart
    keys = {(x.category, x.key) for x in c.differences}
    assert {("model", "actor.model_name_or_path"), ("data", "data.prompt_dataset")} <= keys
    assert ("packing (set by DPPO)", "train.dynamic_batch_enable") in keys
    assert not c.comparable


def test_real_runs_cli(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["compare", str(DATA / "grpo"), str(DATA / "dppo"), "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps its sentences at its width
    assert "dppo is not comparable with grpo: differs in actor.model_name_or_path (model)" in printed
    md = (out / "report.md").read_text()
    # tokens 185 + 169 generated, 2 + 2 trained, none filtered (not logged); measured r_q 0 and r_o 1 next to the configured rates
    assert (
        "| dppo | 354 | 4 | 350 | — | 2 / 64 | 0.000 (cfg 0.25) | 1.000 (cfg 0.5) | 0.0000 | rollout/reward_mean |"
        in md
    )
    names = {p.name for p in out.iterdir()}
    assert names == {"report.md", "reward.png"}
