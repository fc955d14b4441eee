"""The tiny demo's printed summary (`python -m openrlhf_dppo.tiny.progress summary RUN...`): held-out
accuracy and its noise first, then step times and tokens; no speedup that start-up alone could make."""

from __future__ import annotations

from openrlhf_dppo.tiny import progress

CURVE = [0.25, 0.25, 0.375, 0.5, 0.5]


def test_summary_leads_with_heldout_accuracy_and_its_noise(tmp_path, rundirs, capsys):
    # the demo's old failure: GRPO ran first and spent 141 s starting up, DPPO 14 s; same learning
    grpo = rundirs.curve_run(tmp_path / "grpo", step_time=4.0, evals=CURVE, startup=141.0)
    dppo = rundirs.curve_run(tmp_path / "dppo", step_time=4.0, evals=CURVE, startup=14.0, algo="dppo")
    report = progress.print_summary([str(grpo), str(dppo)])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1] == "== held-out accuracy (the comparison that counts) =="
    # every eval point with its standard error, n = 256: sqrt(.25 * .75 / 256) = .027, sqrt(.375 * .625 / 256) = .030
    assert lines[2] == (
        "grpo (arith, step:pass@1±SE, n = 256 per point): 0:0.250±0.027 2:0.250±0.027 4:0.375±0.030 "
        "6:0.500±0.031 8:0.500±0.031"
    )
    # the comparison: equal accuracy, equal training time to it (start-up is in no time axis)
    assert lines[4].startswith(
        "dppo (1 seed) vs grpo (1 seed): final held-out accuracy 0.5000 vs 0.5000 (+0.0000, one seed per arm: "
        "no spread available; SE of one eval point 0.0312, the difference is within twice its SE 0.0442; each "
        "the median of the evals at steps 4-8, last eval 0.5000 vs 0.5000); reached the held-out target 0.5000 "
        "in 24.0 s of training vs 24.0 s: matched-accuracy ratio 1.00"
    )
    assert "as fast" not in out and report.comparisons[0].ttt_ratio == 1.0
    # then time and tokens, start-up reported on its own
    time_header = lines.index(
        "== time (training time = sum of step times; start-up and eval apart) and tokens =="
    )
    assert time_header > 4
    grpo_row = next(line for line in lines[time_header:] if line.startswith("grpo "))
    assert grpo_row.split()[:6] == ["grpo", "8", "4.00", "32.0", "141.0", "7.5"]


def test_a_final_from_few_eval_points_says_which_evals_it_is_and_how_far_the_last_one_is(
    tmp_path, rundirs, capsys
):
    """`STEPS=30 make demo`: evals at steps 0, 10, 20, 30. The final is the median of steps 10-30,
    which on a rising curve is step 20's reading; the summary says so and gives the last readings."""
    grpo = rundirs.curve_run(
        tmp_path / "grpo", step_time=4.0, evals=[0.434, 0.46, 0.51, 0.578], eval_every=10
    )
    dppo = rundirs.curve_run(
        tmp_path / "dppo", step_time=2.0, evals=[0.434, 0.47, 0.488, 0.568], eval_every=10, algo="dppo"
    )
    progress.print_summary([str(grpo), str(dppo)])
    out = capsys.readouterr().out
    assert (
        "final held-out accuracy 0.4880 vs 0.5100 (-0.0220, one seed per arm: no spread available; SE of one "
        "eval point 0.0312, the difference is within twice its SE 0.0442; each the median of the evals at "
        "steps 10-30, last eval 0.5680 vs 0.5780)" in out
    )
    # the gap between the final and the last reading is more than twice the SE (n = 256: .031): a note
    assert (
        "note: arm grpo: its last eval 0.5780 (step 30) is +0.0680 from its final 0.5100 (the median of the "
        "evals at steps 10-30), more than twice the SE of one eval point (0.0312)" in out
    )
    assert "note: arm dppo: its last eval 0.5680 (step 30) is +0.0800 from its final 0.4880" in out


def test_summary_with_several_seeds_gives_their_spread(tmp_path, rundirs, capsys):
    for seed, curve in ((1, CURVE), (2, [0.25, 0.25, 0.25, 0.375, 0.375])):
        rundirs.curve_run(tmp_path / f"grpo_s{seed}", step_time=4.0, evals=curve, seed=seed)
        rundirs.curve_run(tmp_path / f"dppo_s{seed}", step_time=2.0, evals=curve, seed=seed, algo="dppo")
    progress.print_summary([str(p) for p in sorted(tmp_path.iterdir(), reverse=True)])
    out = capsys.readouterr().out
    # finals .5 and .375 in both arms: difference 0, within the seed spread (sd .088)
    assert (
        "dppo_s* (2 seeds) vs grpo_s* (2 seeds): final held-out accuracy 0.4375 vs 0.4375 (+0.0000, within "
        in out
    )


def test_summary_of_a_missing_run_says_so(tmp_path, capsys):
    assert progress.print_summary([str(tmp_path / "nope")]) is None
    assert "run directory not found" in capsys.readouterr().out
