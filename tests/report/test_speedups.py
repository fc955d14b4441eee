"""Speedups of the compare report on hand-written runs, derived by hand below.

The runs (conftest.py), 5 steps each, phases = (generation, make_experience, ppo_train, broadcast):
  GRPO step totals   10, 4, 4, 5, 4      generation 6, 2, 2, 3, 2    wall 10, 14, 18, 23, 27
  DPPO step totals    8, 2, 2, 2.5, 2    wall 8, 10, 12, 14.5, 16.5
  GRPO reward         0, .25, .25, .5, .5
  DPPO reward         .25, .25, .5, .5, .75
  DPPO prompt keep    1, .5, .5, .5, .5   completion keep 1, .625, .375, .5, .5
  samples generated   GRPO 32 a step; DPPO 32 x its prompt keep (it rolls out only the kept prompts)
"""

from __future__ import annotations

import json

import pytest

from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report import speedup as S
from openrlhf_dppo.report.headline import headline
from openrlhf_dppo.report.tables import speedup_table

TOL = dict(rel=1e-12, abs=1e-12)


def _report(grpo_dir, dppo_dir, **settings):
    return build_report([load_run(grpo_dir), load_run(dppo_dir)], Settings(**settings))


def test_step_speedup_generation_share_and_ideal(grpo_dir, dppo_dir):
    rep = _report(grpo_dir, dppo_dir, warmup=1)
    grpo, dppo = rep.summaries
    c = rep.comparisons[0]
    # warm-up 1 drops step 1. GRPO totals 4, 4, 5, 4 -> median 4; DPPO 2, 2, 2.5, 2 -> median 2
    assert grpo.step_time == pytest.approx(4.0, **TOL)
    assert dppo.step_time == pytest.approx(2.0, **TOL)
    assert c.step_speedup == pytest.approx(4.0 / 2.0, **TOL)
    # f = median generation (2, 2, 3, 2 -> 2) / median total (4) = 0.5
    assert c.f == pytest.approx(0.5, **TOL)
    # r_q = 1 - mean(.5, .5, .5, .5) = .5; r_o = 1 - mean(.625, .375, .5, .5) = 1 - 2/4 = .5
    assert (c.r_q, c.r_o) == pytest.approx((0.5, 0.5), **TOL)
    # it rolls out only its kept prompts: g = 16 / 32 samples a step = 1 - r_q
    assert (c.rollout, c.rollout_measured) == (0.5, True)
    # ideal T_dppo / T_grpo = (1 - .5) * (.5 + (1 - .5) * (1 - .5)) = .5 * .75 = .375 -> 8/3 x
    assert c.ideal_ratio == pytest.approx(0.375, **TOL)
    assert c.ideal_speedup == pytest.approx(8.0 / 3.0, **TOL)
    # measured / ideal = 2 / (8/3) = 0.75
    assert c.step_efficiency == pytest.approx(0.75, **TOL)
    # per-phase medians of DPPO after warm-up: generation 1, 1, 1.5, 1 -> 1; ppo_train .25
    assert dppo.phases["timing/generation"] == pytest.approx(1.0, **TOL)
    assert dppo.phases["timing/ppo_train"] == pytest.approx(0.25, **TOL)
    # tokens are summed over all 5 steps (warm-up included: it is work done): 5 * 50, 5 * 25
    assert dppo.totals["tokens/generated"] == 250.0 and dppo.totals["tokens/pruned"] == 125.0
    assert grpo.totals["tokens/generated"] == 500.0
    assert dppo.configured_rates == (0.5, 0.5)
    assert not c.differences  # same args but dppo.*, ckpt dirs and logger names


def test_the_training_reward_is_a_trailing_mean_of_five_steps_and_no_headline(grpo_dir, dppo_dir):
    rep = _report(grpo_dir, dppo_dir)
    grpo, dppo = rep.summaries
    # GRPO's rewards 0, .25, .25, .5, .5 -> trailing means 0, .125, .5/3, .25, .3
    assert grpo.reward_smoothed == pytest.approx([0.0, 0.125, 0.5 / 3, 0.25, 0.3], **TOL)
    assert grpo.final_reward == pytest.approx(0.3, **TOL) and dppo.final_reward == pytest.approx(0.45, **TOL)
    # the training reward is no held-out measure: the headline does not speak of it
    assert "reward" not in headline(rep)[0]


def test_warmup_zero_uses_every_step(grpo_dir, dppo_dir):
    c = _report(grpo_dir, dppo_dir, warmup=0).comparisons[0]
    # keep fractions over all 5 steps: prompts (1 + 4 * .5) / 5 = .6, completions (1 + 2) / 5 = .6
    assert (c.r_q, c.r_o) == pytest.approx((0.4, 0.4), **TOL)
    # f: median gen (6, 2, 2, 3, 2 -> 2) / median total (10, 4, 4, 5, 4 -> 4) = .5
    # ideal ratio = .6 * (.5 + .5 * .6) = .48
    assert c.ideal_ratio == pytest.approx(0.48, **TOL)


def test_baseline_by_name_reverses_the_comparison(grpo_dir, dppo_dir):
    rep = build_report([load_run(grpo_dir), load_run(dppo_dir)], Settings(), baseline="dppo")
    assert [s.run.name for s in rep.summaries] == ["dppo", "grpo"]
    c = rep.comparisons[0]
    assert c.step_speedup == pytest.approx(0.5, **TOL)  # 2 / 4
    # f now from the DPPO baseline: median gen 1 / median total 2 = .5; the GRPO run prunes nothing
    # but rolls out twice the baseline's samples a step (32 against 16 after warm-up): g = 2, and the
    # ideal ratio is 2 (f + (1 - f)) = 2, the 0.5x its steps measure
    assert (c.f, c.r_q, c.r_o, c.rollout, c.ideal_ratio) == pytest.approx((0.5, 0.0, 0.0, 2.0, 2.0), **TOL)
    assert any("not GRPO" in w for w in rep.warnings)
    with pytest.raises(ValueError, match="none of the runs"):
        build_report([load_run(grpo_dir)], Settings(), baseline="nope")


def test_pure_helpers():
    assert S.moving_average([1.0, 2.0, 3.0, 4.0], 3) == [1.0, 1.5, 2.0, 3.0]
    assert S.after_warmup([5.0, 1.0, 2.0], 1) == [1.0, 2.0]
    assert S.after_warmup([5.0], 1) == [5.0]  # too few steps: keep them rather than return nothing
    # f = 1 (generation only): completion pruning saves nothing, prompt pruning saves r_q
    assert S.ideal_step_ratio(1.0, 0.3, 0.9) == pytest.approx(0.7, **TOL)
    # f = 0: both rates multiply
    assert S.ideal_step_ratio(0.0, 0.5, 0.5) == pytest.approx(0.25, **TOL)
    with pytest.raises(ValueError, match="r_o"):
        S.ideal_step_ratio(0.5, 0.1, 1.5)
    # METHOD's bound with 1 - r_q = g; g may exceed 1 (a step that rolls out more than the baseline's)
    assert S.rollout_step_ratio(0.4, 0.7, 0.5) == pytest.approx(S.ideal_step_ratio(0.4, 0.3, 0.5), **TOL)
    assert S.rollout_step_ratio(0.5, 2.0, 0.0) == pytest.approx(2.0, **TOL)
    with pytest.raises(ValueError, match="g "):
        S.rollout_step_ratio(0.5, -0.1, 0.0)


def test_startup_is_reported_and_is_not_training_time(tmp_path, rundirs, grpo_dir):
    # the same GRPO steps after 30 s of start-up: wall 40, 44, 48, 53, 57
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD, startup=30.0)
    late = load_run(rundirs.write_run(tmp_path / "late", rows))
    rep = build_report([load_run(grpo_dir), late], Settings())
    base, other = rep.summaries
    assert (base.startup, other.startup) == (0.0, 30.0)  # wall(1) - step_total(1) = 10 - 10, 40 - 10
    assert rep.comparisons[0].step_speedup == 1.0
    # training time leaves start-up out: both end at 27 s of training
    assert base.train_time == other.train_time == 27.0


def test_eval_results_with_different_k_are_flagged(grpo_dir, dppo_dir):
    assert not any("eval_results.json" in w for w in _report(grpo_dir, dppo_dir).warnings)
    res = json.loads((dppo_dir / "eval_results.json").read_text())
    res["k"] = 8
    (dppo_dir / "eval_results.json").write_text(json.dumps(res))
    warnings = _report(grpo_dir, dppo_dir).warnings
    assert (
        "the eval_results.json files differ in k or benchmarks (grpo: k=4, ['gsm8k', 'math500']; "
        "dppo: k=8, ['gsm8k', 'math500'])" in warnings
    )


def _without_samples_generated(run_dir):
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "samples/generated"}) + "\n" for r in rows)
    )


def test_the_ideal_takes_the_rollout_a_step_does_not_the_prompt_keep_fraction(grpo_dir, dppo_dir):
    # refill: it keeps half of the prompts it draws (2B) and rolls out as many samples a step as GRPO
    path = dppo_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        if r.get("kind") == "train":
            r["samples/generated"] = 32.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = _report(grpo_dir, dppo_dir, warmup=1).comparisons[0]
    assert (c.r_q, c.r_o, c.rollout, c.rollout_measured) == pytest.approx((0.5, 0.5, 1.0, True), **TOL)
    # ideal = 1 * (.5 + .5 * .5) = .75 -> 1.33x, not the 2.67x that 1 - r_q would claim
    assert c.ideal_ratio == pytest.approx(0.75, **TOL)
    assert c.step_efficiency == pytest.approx(2.0 / (4.0 / 3.0), **TOL)


def test_without_samples_generated_the_rollout_is_taken_as_one_minus_r_q(grpo_dir, dppo_dir):
    _without_samples_generated(grpo_dir)
    _without_samples_generated(dppo_dir)
    rep = _report(grpo_dir, dppo_dir, warmup=1)
    c = rep.comparisons[0]
    assert (c.rollout, c.rollout_measured, c.ideal_ratio) == pytest.approx((0.5, False, 0.375), **TOL)
    title, headers, rows = speedup_table(rep)
    assert rows[0][headers.index("g")] == "0.500 (1 - r_q)"


def _with_equal_reward_shares(run_dir, shares):
    """Step i (1-based) of the run logs rollout/equal_reward_frac_ht = shares[i - 1] (None: left out)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        if r.get("kind") == "train" and shares[r["step"] - 1] is not None:
            r["rollout/equal_reward_frac_ht"] = shares[r["step"] - 1]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_lossless_limit_is_the_baselines_step_time_weighted_equal_reward_share(grpo_dir, dppo_dir):
    # GRPO's steps 2-5 (after warm-up 1) take 4, 4, 5, 4 s with shares .5, .25, .2, 0 (step 1's .9 is
    # left out): the oracle takes 2 + 3 + 4 + 4 = 13 of 17 s -> ratio 13/17, limit 17/13 x
    _with_equal_reward_shares(grpo_dir, [0.9, 0.5, 0.25, 0.2, 0.0])
    _with_equal_reward_shares(dppo_dir, [0.1, 0.1, 0.1, 0.1, 0.1])  # the arm's own shares do not enter
    rep = _report(grpo_dir, dppo_dir, warmup=1)
    grpo, dppo = rep.summaries
    assert grpo.lossless_ratio == pytest.approx(13 / 17, **TOL)
    assert dppo.lossless_ratio == pytest.approx(0.9, **TOL)
    c = rep.comparisons[0]
    assert c.lossless_ratio == pytest.approx(13 / 17, **TOL)
    assert c.lossless_speedup == pytest.approx(17 / 13, **TOL)
    title, headers, rows = speedup_table(rep)
    assert rows[0][headers.index("lossless limit (baseline)")] == "1.31x"
    assert "lossless limit = the speedup of skipping only the baseline's groups" in title


def test_the_lossless_limit_needs_the_share_on_every_step_used(grpo_dir, dppo_dir):
    _with_equal_reward_shares(grpo_dir, [0.9, 0.5, None, 0.2, 0.0])  # a step without it: no limit
    rep = _report(grpo_dir, dppo_dir, warmup=1)
    assert rep.summaries[0].lossless_ratio is None and rep.comparisons[0].lossless_speedup is None
    title, headers, rows = speedup_table(rep)
    assert rows[0][headers.index("lossless limit (baseline)")] == "—"
    with pytest.raises(ValueError, match=">= 0"):
        S.lossless_time_ratio([-0.5], [1.0])
    with pytest.raises(ValueError, match="one share per step time"):
        S.lossless_time_ratio([0.5, 0.5], [1.0])


def test_a_pruned_runs_horvitz_thompson_share_above_one_is_taken_as_it_is(grpo_dir, dppo_dir):
    # a DPPO step that rolled out mostly all-equal groups kept with a low q: HT share 1.5 on step 3
    _with_equal_reward_shares(grpo_dir, [0.3, 0.3, 0.3, 0.3, 0.3])
    _with_equal_reward_shares(dppo_dir, [0.2, 0.2, 1.5, 0.2, 0.2])
    rep = _report(grpo_dir, dppo_dir, warmup=1)
    # DPPO's steps 2-5 take 2, 2, 2.5, 2 s: (1.6 - 1 + 2 + 1.6) / 8.5 s, unclipped
    assert rep.summaries[1].lossless_ratio == pytest.approx((1.6 - 1.0 + 2.0 + 1.6) / 8.5, **TOL)
    assert rep.comparisons[0].lossless_ratio == pytest.approx(0.7, **TOL)  # the baseline's
