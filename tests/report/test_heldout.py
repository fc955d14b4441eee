"""Held-out accuracy against training time, over seeds: the numbers the compare headline is made of.

Every run below is built by ``curve_run`` (conftest.py): constant step time T, held-out evaluations at
steps 0, 2, 4, 6, 8 (training time 0, 2T, 4T, 6T, 8T), running median over 3 eval points, centred: no
smoothed value at step 0 (a window moved forward there would look two evals ahead), the last 3 points
at step 8. Accuracies are multiples of 1/8, so the medians are exact.
"""

from __future__ import annotations

import math

import pytest

from openrlhf_dppo.cli.main import main
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report.curves import Spread, crossing_time, running_median, standard_error, within_spread
from openrlhf_dppo.report.headline import headline
from openrlhf_dppo.report.render import markdown

TOL = dict(rel=1e-12, abs=1e-12)
GRPO = {  # seed: (step time, held-out curve, start-up)
    1: (4.0, [0.25, 0.25, 0.375, 0.5, 0.5], 100.0),
    2: (4.0, [0.25, 0.375, 0.375, 0.5, 0.625], 10.0),
    3: (4.0, [0.25, 0.25, 0.25, 0.375, 0.5], 10.0),
}
DPPO = {
    1: (2.0, [0.25, 0.375, 0.5, 0.5, 0.5], 5.0),
    2: (2.0, [0.25, 0.25, 0.5, 0.5, 0.625], 5.0),
    3: (3.0, [0.25, 0.25, 0.375, 0.5, 0.5], 5.0),
}


def _arm(tmp_path, rundirs, prefix, table, algo):
    return [
        rundirs.curve_run(
            tmp_path / f"{prefix}_s{seed}", step_time=t, evals=ev, startup=up, seed=seed, algo=algo
        )
        for seed, (t, ev, up) in table.items()
    ]


@pytest.fixture
def seeds(tmp_path, rundirs):
    return _arm(tmp_path, rundirs, "grpo", GRPO, "grpo"), _arm(tmp_path, rundirs, "dppo", DPPO, "dppo")


def test_pure_curve_rules():
    # window 3, centred: i0 has no value (the old rule gave it the median of points 0-2, .375, looking
    # two evals ahead); i1 uses 0-2; at the end the window looks back: i4 uses 2-4
    assert running_median([0.25, 0.375, 1.0, 0.5, 0.0], 3) == [None, 0.375, 0.5, 0.5, 0.5]
    assert running_median([0.1, 0.9], 3) == [None, None]  # fewer points than the window: no value
    # window 5 over 1..6: i0, i1 none; i2 = med(1..5) = 3; i3 = med(2..6) = 4; i4, i5 look back: med(2..6)
    assert running_median([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 5) == [None, None, 3.0, 4.0, 4.0, 4.0]
    assert running_median([0.3, 0.1], 1) == [0.3, 0.1]  # window 1: the raw points
    with pytest.raises(ValueError, match="odd number"):
        running_median([0.1], 2)
    # (0, .25) -> (8, .75): .5 is reached half-way, at 4; a target met at the first point: its time
    assert crossing_time([0.0, 8.0], [0.25, 0.75], 0.5) == 4.0
    assert crossing_time([3.0, 8.0], [0.5, 0.75], 0.5) == 3.0
    assert crossing_time([0.0, 8.0], [0.25, 0.4], 0.5) is None
    # points without a smoothed value are skipped: (4, .25) -> (8, .75) crosses .5 at 6
    assert crossing_time([0.0, 4.0, 8.0], [None, 0.25, 0.75], 0.5) == 6.0
    assert crossing_time([0.0, 4.0, 8.0], [None, 0.5, 0.75], 0.5) == 4.0  # at its first smoothed point
    assert standard_error(0.5, 100) == 0.05 and standard_error(0.5, None) is None
    sp = Spread.of([1.0, 3.0, None])
    assert (sp.n, sp.k, sp.mean, sp.std, sp.lo, sp.hi) == (3, 2, 2.0, math.sqrt(2.0), 1.0, 3.0)
    assert within_spread(Spread.of([1.0, 3.0]), Spread.of([2.4])) is True  # |2.4 - 2| <= sqrt 2
    assert within_spread(Spread.of([1.0, 3.0]), Spread.of([3.5])) is False
    assert within_spread(Spread.of([1.0]), Spread.of([3.5])) is None  # no spread with one seed each


def test_seeds_form_arms_with_mean_and_spread(seeds):
    grpo, dppo = seeds
    rep = build_report([load_run(p) for p in grpo + dppo], Settings())
    base, other = rep.arms
    assert (base.name, other.name, base.n, other.n) == ("grpo_s*", "dppo_s*", 3, 3)
    assert base.seeds == [1, 2, 3]
    # smoothed GRPO curves: s1 - .25 .375 .5 .5 | s2 - .375 .375 .5 .5 | s3 - .25 .25 .375 .375
    assert [s.heldout.smoothed for s in base.members] == [
        [None, 0.25, 0.375, 0.5, 0.5],
        [None, 0.375, 0.375, 0.5, 0.5],
        [None, 0.25, 0.25, 0.375, 0.375],
    ]
    assert base.curve.smoothed[0] is None and base.curve.final_steps == [4, 6, 8]
    # finals .5, .5, .375: mean 11/24, sample sd sqrt(((1/24)^2 * 2 + (1/12)^2) / 2) = sqrt(1/192)
    assert base.final.mean == pytest.approx(11 / 24, **TOL)
    assert base.final.std == pytest.approx(math.sqrt(1 / 192), **TOL)
    assert (base.final.lo, base.final.hi) == (0.375, 0.5)
    assert rep.target == pytest.approx(11 / 24, **TOL) and "baseline grpo_s*" in rep.target_source
    # GRPO mean curve: none, (.25+.375+.25)/3, 1/3, 11/24, 11/24 at times 0, 8, 16, 24, 32:
    # it reaches 11/24 at 24 s (a point at the target exactly)
    assert base.curve.times == [0.0, 8.0, 16.0, 24.0, 32.0]
    assert base.ttt == pytest.approx(24.0, **TOL)
    # per seed: s1 and s2 cross between (16, .375) and (24, .5): 16 + (11/24 - 3/8) / (1/8) * 8 = 21 1/3;
    # s3 never reaches 11/24: censored, counted, not dropped
    assert base.ttt_seeds.values[:2] == pytest.approx((64 / 3, 64 / 3), **TOL)
    assert base.ttt_seeds.values[2] is None and (base.ttt_seeds.k, base.ttt_seeds.n) == (2, 3)
    # DPPO: smoothed s1 - .375 .5 .5 .5 | s2 - .25 .5 .5 .5 | s3 - .25 .375 .5 .5; finals all .5
    assert other.final.values == (0.5, 0.5, 0.5) and other.final.std == 0.0
    # mean curve at mean times 0, 14/3, 28/3, 14, 56/3 (step times 2, 2, 3): none, 7/24, 11/24, ...
    assert other.curve.times == pytest.approx([0.0, 14 / 3, 28 / 3, 14.0, 56 / 3], **TOL)
    assert other.ttt == pytest.approx(28 / 3, **TOL)
    # seeds: s1 4 + (1/12)/(1/8) * 4 = 20/3; s2 4 + (5/24)/(1/4) * 4 = 22/3; s3 12 + (2/3) * 6 = 16
    assert other.ttt_seeds.values == pytest.approx((20 / 3, 22 / 3, 16.0), **TOL)
    assert other.ttt_seeds.mean == pytest.approx(10.0, **TOL)
    assert other.ttt_seeds.std == pytest.approx(math.sqrt(244) / 3, **TOL)  # deviations -10/3, -8/3, 6
    c = rep.comparisons[0]
    assert c.ttt_ratio == pytest.approx((28 / 3) / 24, **TOL)  # 7/18: the matched-accuracy ratio
    assert c.ttt_ratios.values == pytest.approx((20 / 72, 22 / 72, 16 / 24), **TOL)
    # step times: GRPO 4, 4, 4; DPPO 2, 2, 3 -> 4 / (7/3) = 12/7; per seed 2, 2, 4/3
    assert c.step_speedup == pytest.approx(12 / 7, **TOL)
    assert c.step_speedups.values == pytest.approx((2.0, 2.0, 4 / 3), **TOL)
    # final accuracy: +1/24, within the larger sd sqrt(1/192) = .072; time to target: 10 - 64/3 is not
    assert c.final_delta == pytest.approx(1 / 24, **TOL)
    assert c.final_within_spread is True and c.ttt_within_spread is False
    # start-up (100, 10, 10 vs 5, 5, 5) and evaluation are reported, in no time axis
    assert base.spread("startup").values == (100.0, 10.0, 10.0)
    assert base.spread("eval_time").values == (7.5, 7.5, 7.5)  # 5 evaluations of 1.5 s


def test_headline_states_the_noise_and_the_censored_seeds(seeds, tmp_path):
    grpo, dppo = seeds
    rep = build_report([load_run(p) for p in grpo + dppo], Settings())
    (line,) = headline(rep)
    # the finals are medians of steps 4-8; the last evals are (.5 + .625 + .5) / 3 = 13/24 in both arms
    assert line.startswith(
        "dppo_s* (3 seeds) vs grpo_s* (3 seeds): final held-out accuracy 0.5000 vs 0.4583 (+0.0417, within the "
        "seed spread of the final accuracy; SE of one eval point 0.0311; each the median of the evals at "
        "steps 4-8, last eval 0.5417 vs 0.5417);"
    )  # SE sqrt(11/24 * 13/24 / 256) = .0311
    assert (
        "reached the held-out target 0.4583 in 9.3 s of training vs 24.0 s: matched-accuracy ratio 0.39 "
        "(seeds 0.28–0.67), 3 of 3 seeds reached it; larger than the seed spread of the time to target;"
        in line
    )
    # nothing pruned, the same rollout: g = 1, r_o = 0, ideal 1x; a speedup above the ideal is
    # marked in the sentence and explained in a warning, not reported as a result
    assert line.endswith("1.71x step-time speedup (171% of the ideal 1.00x: above it, see warnings)")
    assert (
        "dppo_s*'s step-time speedup 1.71x is above the ideal 1.00x that its measured rollout and pruning rates allow "
        "(171%): pruning alone does not explain it" in " ".join(rep.warnings)
    )
    md = markdown(rep)
    assert "| grpo_s* | 3 | 0.4583 ± 0.0722 (0.3750–0.5000) | baseline | 0.0311 |" in md
    # the table says it too: the accuracy difference is within the seed spread, the time difference not
    assert (
        "| dppo_s* | 3 | 0.5000 ± 0.0000 (0.5000–0.5000) | +0.0417, within the seed spread | 0.0312 |" in md
    )
    assert "| 0.39 (seeds 0.28–0.67) | beyond the seed spread |" in md
    assert "| 24.0 | 21.3 ± 0.0 (21.3–21.3) [2 of 3] | baseline |" in md  # the censored GRPO seed


def test_one_seed_per_arm_says_no_spread_is_available(tmp_path, rundirs):
    a = rundirs.curve_run(tmp_path / "grpo", step_time=4.0, evals=GRPO[1][1])
    b = rundirs.curve_run(tmp_path / "dppo", step_time=2.0, evals=DPPO[1][1], algo="dppo")
    rep = build_report([load_run(a), load_run(b)], Settings())
    c = rep.comparisons[0]
    assert c.final_within_spread is None and c.ttt_within_spread is None
    (line,) = headline(rep)
    # no seed spread: the difference is held against its eval standard error, sqrt(2) x 1/32
    assert (
        "(+0.0000, one seed per arm: no spread available; SE of one eval point 0.0312, the difference is within twice its SE 0.0442;"
        in line
    )
    assert "1 of 1 seed reached it; one seed per arm: no spread available" in line


def test_a_startup_difference_alone_gives_no_time_to_target_speedup(tmp_path, rundirs):
    """Same step times and curves; one run spends 300 s starting up, the other 5 s."""
    for time_keys in (True, False):  # today's runs, and older ones without time/train_s
        slow = rundirs.curve_run(
            tmp_path / f"slow{time_keys}", step_time=4.0, evals=GRPO[1][1], startup=300.0, time_keys=time_keys
        )
        fast = rundirs.curve_run(
            tmp_path / f"fast{time_keys}",
            step_time=4.0,
            evals=GRPO[1][1],
            startup=5.0,
            time_keys=time_keys,
            seed=7,
        )
        rep = build_report(
            [load_run(slow), load_run(fast)],
            Settings(),
            arms={f"slow{time_keys}": "slow", f"fast{time_keys}": "fast"},
        )
        c = rep.comparisons[0]
        assert (
            rep.arms[0].ttt == rep.arms[1].ttt == 24.0
        )  # the mean curve .25 .25 .375 .5 .5 reaches .5 at step 6
        assert c.ttt_ratio == 1.0 and c.step_speedup == 1.0
        assert [s.startup for s in rep.summaries] == [300.0, 5.0]
        assert "matched-accuracy ratio 1.00" in headline(rep)[0]


def test_one_outlier_eval_point_does_not_move_the_headline(tmp_path, rundirs):
    # baseline: .25 x4, .375, .5 x3 -> smoothed - .25 .25 .25 .375 .5 .5 .5: final .5, reached at step 10
    clean = [0.25, 0.25, 0.25, 0.25, 0.375, 0.5, 0.5, 0.5]
    noisy = list(clean)
    noisy[1], noisy[7] = 1.0, 0.0  # a spike long before the crossing, a dip at the very end
    a = rundirs.curve_run(tmp_path / "clean", step_time=4.0, evals=clean)
    b = rundirs.curve_run(tmp_path / "noisy", step_time=4.0, evals=noisy, seed=7)
    runs, arms = [load_run(a), load_run(b)], {"clean": "clean", "noisy": "noisy"}
    rep = build_report(runs, Settings(), arms=arms)
    assert rep.summaries[1].heldout.smoothed == rep.summaries[0].heldout.smoothed
    assert rep.comparisons[0].ttt_ratio == 1.0 and rep.comparisons[0].final_delta == 0.0
    # the test can fail: without smoothing the spike "reaches" .5 at 8/3 s and the dip sets the final
    rep = build_report(runs, Settings(eval_window=1), arms=arms)
    assert rep.arms[1].ttt == pytest.approx(8 / 3, **TOL) and rep.arms[1].final.mean == 0.0


def test_cli_arms_baseline_glob_and_report(seeds, tmp_path, capsys):
    grpo, dppo = seeds
    root = grpo[0].parent
    out = tmp_path / "rep"
    assert (
        main(["compare", str(root / "dppo_s*"), "--baseline", str(root / "grpo_s*"), "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "matched-accuracy ratio 0.39" in printed and "dppo_s* (3 seeds) vs grpo_s* (3 seeds)" in printed
    md = (out / "report.md").read_text()
    assert "- arm `grpo_s*` (baseline):" in md and "![heldout](heldout.png)" in md
    # explicit arm names, the baseline named by arm; the shell-expanded form (one path per argument) too
    argv = [
        "compare",
        *map(str, grpo),
        *map(str, dppo),
        "--arm",
        f"B={root}/grpo_s*",
        "--arm",
        f"D={root}/dppo_s*",
    ]
    assert main([*argv, "--baseline", "B"]) == 0
    assert "D (3 seeds) vs B (3 seeds)" in capsys.readouterr().out
    assert main(["compare", *map(str, dppo), "--baseline", str(grpo[0]), *map(str, grpo[1:])]) == 0
    assert "dppo_s* (3 seeds) vs grpo_s* (3 seeds)" in capsys.readouterr().out
    # an arm named as compare names it (the glob matches nothing here: it is taken as a name)
    assert main(["compare", *map(str, dppo + grpo), "--baseline", "grpo_s*"]) == 0
    assert "dppo_s* (3 seeds) vs grpo_s* (3 seeds)" in capsys.readouterr().out
    assert main(["compare", *map(str, dppo + grpo), "--heldout", "gsm8k"]) == 2
    assert "--heldout 'gsm8k': not evaluated by dppo_s1, dppo_s2" in capsys.readouterr().err
    assert main(["compare", "--arm", "x", str(grpo[0])]) == 2
    assert "--arm expects NAME=GLOB, got 'x'" in capsys.readouterr().err
    assert main(["compare", str(root / "nothing_*")]) == 2
    assert "matches no run directory" in capsys.readouterr().err


def test_the_heldout_plot_draws_seeds_thin_and_the_mean_bold(seeds):
    from openrlhf_dppo.report.plots import build_figures

    grpo, dppo = seeds
    fig = build_figures(build_report([load_run(p) for p in grpo + dppo], Settings()))["heldout"]
    by_time = fig.axes[0]
    widths = sorted(line.get_linewidth() for line in by_time.get_lines() if line.get_linestyle() == "-")
    assert widths == [0.8] * 6 + [2.5] * 2  # six seeds thin, two arm means bold
    labels = {line.get_label() for line in by_time.get_lines() if not line.get_label().startswith("_")}
    assert labels == {"grpo_s* (mean of 3)", "dppo_s* (mean of 3)", "target"}


def test_the_console_summary_fits_100_columns_and_the_full_tables_stay_in_report_md(
    seeds, tmp_path, capsys, monkeypatch
):
    grpo, dppo = seeds
    root = grpo[0].parent
    monkeypatch.setenv("COLUMNS", "100")
    argv = ["compare", str(root / "dppo_s*"), "--baseline", str(root / "grpo_s*")]
    assert main([*argv, "--out", str(tmp_path / "rep")]) == 0
    lines = capsys.readouterr().out.splitlines()
    wide = [line for line in lines if len(line) > 100 and str(tmp_path) not in line]  # a path is the user's
    assert not wide, "\n".join(wide)
    header = next(line for line in lines if line.split()[:2] == ["arm", "seeds"])
    for words in ("final acc", "vs baseline", "time to target", "step speedup"):  # no header split mid-word
        assert words in header, header
    row = next(line for line in lines if line.split()[:2] == ["dppo_s*", "3"])
    assert (
        "0.39x" in row
    )  # the matched-accuracy ratio of the headline (test_cli_arms_baseline_glob_and_report)
    assert any("are in report.md" in line for line in lines)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| arm | seeds | final held-out acc | vs baseline | SE of one eval |" in md  # the full table
    # the full tables are wider than 100 columns: the check above can fail
    monkeypatch.setenv("COLUMNS", "200")
    assert main([*argv, "--tables"]) == 0
    assert max(map(len, capsys.readouterr().out.splitlines())) > 100
