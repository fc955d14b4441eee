"""report.checks: what makes compare's numbers mislead is said, for every arm, before anyone reads them.

Runs are built by ``curve_run`` (conftest.py): held-out evals at steps 0, 2, 4, 6, 8, step time T.
"""

from __future__ import annotations

import json

import pytest

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report.headline import headline

CURVE = [0.25, 0.25, 0.375, 0.5, 0.5]
RAN_OUT = "the prompt data ran out after 4 of --dppo.max_steps 8 steps; raise --train.num_episodes"
MACHINE = {
    R.MACHINE_CPU_MODEL: "Intel Xeon",
    R.MACHINE_CPU_NATIVE_BF16: True,
    R.MACHINE_TORCH_CPU_CAPABILITY: "AVX512",
    R.MACHINE_DEVICE: "cpu",
    R.MACHINE_PRECISION: "bf16",
}


def _edit(path, name: str, **changes):
    """Update a JSON file of a run directory in place."""
    data = json.loads((path / name).read_text())
    data.update(changes)
    (path / name).write_text(json.dumps(data))


def _pair(tmp_path, rundirs, grpo_curve=CURVE, dppo_curve=CURVE):
    grpo = rundirs.curve_run(tmp_path / "grpo", step_time=4.0, evals=grpo_curve)
    dppo = rundirs.curve_run(tmp_path / "dppo", step_time=2.0, evals=dppo_curve, algo="dppo")
    return grpo, dppo


def _report(*paths, **settings):
    return build_report([load_run(p) for p in paths], Settings(**settings))


def test_a_baseline_that_ran_out_of_prompts_is_warned_about_first_and_marked_in_the_headline(
    tmp_path, rundirs
):
    grpo, dppo = _pair(tmp_path, rundirs)
    _edit(grpo, R.STATUS, reason=RAN_OUT, max_steps=16)
    rep = _report(grpo, dppo)
    assert rep.warnings[0] == (
        f"the BASELINE grpo stopped early ({RAN_OUT}): its final accuracy sets the target, so a short "
        "baseline lowers the target and every arm looks faster; rerun it to its full length or give --target"
    )
    assert headline(rep)[0].endswith("[the baseline stopped early, which lowers the target: see warnings]")


def test_any_run_that_stopped_early_is_warned_about_with_its_reason_or_its_step_count(tmp_path, rundirs):
    grpo, dppo = _pair(tmp_path, rundirs)
    _edit(dppo, R.STATUS, reason=RAN_OUT)
    rep = _report(grpo, dppo)
    assert f"dppo stopped early ({RAN_OUT}): its numbers cover fewer steps than it was set to" in rep.warnings
    assert headline(rep)[0].endswith("[stopped early: see warnings]")
    # an older run without a reason: its step below max_steps says the same
    _edit(dppo, R.STATUS, reason=None, step=8, max_steps=12)
    rep = _report(grpo, dppo)
    assert "dppo stopped early (it finished at step 8 of max_steps 12)" in " ".join(rep.warnings)
    # a run that made its steps: nothing
    _edit(dppo, R.STATUS, max_steps=8)
    assert not any("stopped early" in w for w in _report(grpo, dppo).warnings)


def test_a_run_cancelled_with_a_reason_says_the_reason(tmp_path, rundirs):
    grpo, dppo = _pair(tmp_path, rundirs)
    _edit(dppo, R.STATUS, state="cancelled", reason="scancel by the user")
    rep = _report(grpo, dppo)
    assert "dppo ended with state 'cancelled' (scancel by the user): its numbers are partial" in rep.warnings


def test_any_arm_at_the_target_from_its_first_smoothed_point_is_warned_about(tmp_path, rundirs):
    # DPPO's first three evals have the median .5 = GRPO's final: the old window, moved forward at the
    # start, gave it .5 at time 0 and a ratio of 0.00 without a word; now its first smoothed point is
    # at step 2 (4 s) and the time to target is a bound
    grpo, dppo = _pair(tmp_path, rundirs, dppo_curve=[0.25, 0.5, 0.5, 0.5, 0.5])
    rep = _report(grpo, dppo)
    dppo_arm = rep.arms[1]
    assert dppo_arm.curve.smoothed[0] is None and dppo_arm.ttt == 4.0
    assert (
        "dppo is at the held-out target 0.5000 at its first smoothed eval point (step 2, 4.0 s of training): "
        "its time to target is at most that, not a measured crossing" in rep.warnings
    )
    assert "was at the held-out target 0.5000 from its first smoothed eval point (4.0 s of training, vs 24.0 s): " \
        "matched-accuracy ratio at most 0.17" in headline(rep)[0]  # fmt: skip


def test_a_final_far_from_the_last_reading_is_warned_about(tmp_path, rundirs):
    # GRPO: .25 .25 .25 .25 .5 -> final = median(.25, .25, .5) = .25, the last reading .5: 8 SE away
    grpo, dppo = _pair(tmp_path, rundirs, grpo_curve=[0.25, 0.25, 0.25, 0.25, 0.5])
    rep = _report(grpo, dppo)
    assert any(
        w.startswith("arm grpo: its last eval 0.5000 (step 8) is +0.2500 from its final 0.2500 (the median of "
                     "the evals at steps 4-8), more than twice the SE of one eval point (0.0271)")
        for w in rep.warnings
    )  # fmt: skip
    assert not any(w.startswith("arm dppo: its last eval") for w in rep.warnings)  # .5 vs .5


RISING = [0.25, 0.25, 0.25, 0.375, 0.5, 0.625, 0.75]  # steps 0-12: still climbing at the end


def test_a_baseline_still_climbing_at_its_end_is_warned_about_and_no_other_arm_is(tmp_path, rundirs):
    # last quarter of 12 steps: from step 8 (smoothed median(.375, .5, .625) = .5) to the final
    # median(.5, .625, .75) = .625: +.125, against the SE of one eval at .625 over 256 samples, .0303
    grpo, dppo = _pair(tmp_path, rundirs, grpo_curve=RISING, dppo_curve=RISING)
    rep = _report(grpo, dppo)
    assert rep.arms[0].curve.end_rise() == (8, 0.125)
    assert (
        "the baseline grpo's mean held-out curve rose +0.1250 over the last quarter of its steps (8-12), more "
        "than the noise of its final, the target (0.0303: the SE of one eval point over the root of 1 seed(s)): "
        "the target is the end of a climb, which an arm that learns as the baseline does per step reaches only "
        "at about its own last step (a time to target censored about half the time); run the baseline until "
        "its curve flattens, or give --target" in rep.warnings
    )  # fmt: skip
    assert not any("dppo's mean held-out curve rose" in w for w in rep.warnings)


@pytest.mark.parametrize(
    "curve",
    [CURVE, [0.25, 0.25, 0.375, 0.5, 0.5, 0.5, 0.52]],  # flat from step 4; one last higher reading
)
def test_a_baseline_flat_at_its_end_is_not_called_climbing(tmp_path, rundirs, curve):
    # the one last higher reading (.52) is outside the median of three at the final: no rise at all;
    # a rise within the noise is the next test's single seed
    grpo, dppo = _pair(tmp_path, rundirs, grpo_curve=curve, dppo_curve=curve)
    rep = _report(grpo, dppo)
    assert rep.arms[0].curve.end_rise()[1] == 0.0
    assert not any("mean held-out curve rose" in w for w in rep.warnings)


def test_the_rise_of_a_baseline_of_several_seeds_is_set_against_the_noise_of_their_mean(tmp_path, rundirs):
    # a rise of .025 at the end (steps 0-16, from step 12): above the noise of the mean of three seeds
    # (the SE of one eval at .525 over 256 samples, .0312, / sqrt 3 = .0180), below that of one seed alone
    curve = [0.25, 0.25, 0.375, 0.5, 0.5, 0.5, 0.5, 0.525, 0.525]
    one = _report(rundirs.curve_run(tmp_path / "one" / "grpo", step_time=4.0, evals=curve))
    assert one.arms[0].curve.end_rise() == (12, pytest.approx(0.025))
    assert not any("mean held-out curve rose" in w for w in one.warnings)
    paths = [
        rundirs.curve_run(tmp_path / f"grpo_s{i}", step_time=4.0, evals=curve, seed=i) for i in (1, 2, 3)
    ]
    rep = _report(*paths)
    assert rep.arms[0].n == 3 and rep.arms[0].curve.end_rise() == (12, pytest.approx(0.025))
    assert any("(0.0180: the SE of one eval point over the root of 3 seed(s))" in w for w in rep.warnings)


def test_runs_in_different_precisions_are_not_comparable(tmp_path, rundirs):
    grpo, dppo = _pair(tmp_path, rundirs)
    _edit(grpo, R.RUN_CONFIG, machine=MACHINE)
    _edit(dppo, R.RUN_CONFIG, machine={**MACHINE, R.MACHINE_PRECISION: "fp32"})
    rep = _report(grpo, dppo)
    c = rep.comparisons[0]
    assert not c.comparable
    assert [(d.category, d.key, d.baseline, d.other) for d in c.differences] == [
        ("precision", "machine.precision", "bf16", "fp32")
    ]
    assert "dppo is not comparable with grpo: differs in machine.precision (precision)" in rep.warnings
    assert "[configs differ: see warnings]" in headline(rep)[0]


def test_runs_on_different_machines_are_comparable_with_a_warning_about_every_time(tmp_path, rundirs):
    grpo, dppo = _pair(tmp_path, rundirs)
    _edit(grpo, R.RUN_CONFIG, machine=MACHINE)
    _edit(dppo, R.RUN_CONFIG, machine={**MACHINE, R.MACHINE_CPU_MODEL: "AMD EPYC"})
    rep = _report(grpo, dppo)
    assert rep.comparisons[0].comparable
    assert (
        "dppo and grpo ran on different machines (machine.cpu_model: 'Intel Xeon' vs 'AMD EPYC'): their step "
        "times, training times and time ratios mix the machines' speed with the method's" in rep.warnings
    )
    assert not any("machine not recorded" in w for w in rep.warnings)


def test_a_run_that_does_not_record_its_machine_is_named(tmp_path, rundirs):
    grpo, dppo = _pair(tmp_path, rundirs)
    _edit(grpo, R.RUN_CONFIG, machine=MACHINE)
    rep = _report(grpo, dppo)
    assert rep.comparisons[0].comparable  # a warning, not a difference
    assert (
        "machine not recorded in run_config.json of dppo (written before it was): a comparison across "
        "machines or precisions cannot be ruled out" in rep.warnings
    )


def test_seeds_of_one_arm_in_different_precisions_are_flagged(tmp_path, rundirs):
    runs = [rundirs.curve_run(tmp_path / f"grpo_s{s}", step_time=4.0, evals=CURVE, seed=s) for s in (1, 2)]
    _edit(runs[0], R.RUN_CONFIG, machine=MACHINE)
    _edit(runs[1], R.RUN_CONFIG, machine={**MACHINE, R.MACHINE_PRECISION: "fp32"})
    rep = _report(*runs)
    assert rep.arms[0].n == 2
    assert "arm grpo_s*: grpo_s2 differs from grpo_s1 in machine.precision" in rep.warnings


@pytest.mark.parametrize("window", [3, 5])
def test_too_few_eval_points_for_the_window_give_no_smoothed_value_and_say_so(tmp_path, rundirs, window):
    grpo = rundirs.curve_run(tmp_path / "grpo", step_time=4.0, evals=[0.25, 0.5])
    dppo = rundirs.curve_run(tmp_path / "dppo", step_time=2.0, evals=CURVE[: window - 1], algo="dppo")
    rep = _report(grpo, dppo, eval_window=window)
    assert rep.target is None and not rep.arms[0].measured
    assert (
        f"grpo has 2 eval point(s), fewer than --eval-window {window}: it has no smoothed held-out value"
        in (" ".join(rep.warnings))
    )
    assert "no smoothed held-out value in dppo and grpo: time to accuracy not measured" in headline(rep)[0]


def _log_forward_batches(path, batches: float, largest: float):
    """Add the experience-side forward batch metrics to every train line of a run's metrics.jsonl."""
    lines = [json.loads(x) for x in (path / R.METRICS).read_text().splitlines()]
    for line in lines:
        if line[R.KIND] == R.TRAIN:
            line.update({R.FORWARD_BATCHES: batches, R.FORWARD_TOKENS_MAX: largest})
    (path / R.METRICS).write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_arms_whose_forward_batches_differ_are_named_beside_the_step_times(tmp_path, rundirs):
    grpo, dppo = _pair(tmp_path, rundirs)
    rep = _report(grpo, dppo)
    assert not any("forward batches" in w for w in rep.warnings)  # runs that do not log them
    _log_forward_batches(grpo, 40.0, 49_700.0)  # OpenRLHF's count, rounded down: over a 32k budget
    _log_forward_batches(dppo, 48.0, 32_000.0)
    rep = _report(grpo, dppo)
    assert rep.arms[0].members[0].forward_batches == 40.0
    assert (
        "dppo made 48 experience-side forward batches per step (median; the largest 32,000 tokens), grpo 40 "
        "(the largest 49,700): OpenRLHF (GRPO) rounds its count down to a multiple of the data-parallel size, "
        "so a batch can exceed --rollout.max_tokens_per_gpu x ring x TP, while DPPO keeps each within it where "
        "the samples allow; the step times include that difference (fewer, larger forward calls: less time, "
        "more memory)" in rep.warnings
    )
    _log_forward_batches(dppo, 40.0, 31_000.0)  # the same count: nothing to say
    assert not any("forward batches" in w for w in _report(grpo, dppo).warnings)
