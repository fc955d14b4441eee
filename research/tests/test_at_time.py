"""research.at_time: held-out accuracy read at equal training time, censored past a run's
end, through compare's own path (the same arms, curves, shared datasets and comparability warnings)."""

import contextlib
import io
import json
from pathlib import Path

import pytest

from research import at_time as hat


def test_value_at_interpolates_and_is_none_outside_the_curve():
    times, values = [0.0, 10.0, 20.0], [0.4, 0.5, 0.7]
    assert hat.value_at(times, values, 5.0) == pytest.approx(0.45)
    assert hat.value_at(times, values, 20.0) == pytest.approx(0.7)
    assert hat.value_at(times, values, 20.5) is None  # the run had stopped
    assert hat.value_at(times, values, -1.0) is None


def _run(
    root: Path,
    name: str,
    step_time: float,
    accs: list[float] | dict[str, list[float]],
    first_eval: int = 0,
    lr: float = 1e-3,
    status: dict | None = None,
) -> str:
    """A run directory: one train line per step (step time ``step_time``), an eval every step from
    ``first_eval`` (a resumed run has no step-0 eval) of each dataset in ``accs`` ({name: values},
    or a list for the one dataset "d"); ``lr`` goes into the config."""
    d = root / name
    d.mkdir()
    accs = accs if isinstance(accs, dict) else {"d": accs}
    n = len(next(iter(accs.values())))
    args = {"eval": {"temperature": 0.0, "n_samples_per_prompt": 1}, "actor": {"learning_rate": lr}}
    (d / "run_config.json").write_text(json.dumps({"args": args}))
    last = first_eval + n - 1
    (d / "status.json").write_text(json.dumps(status or {"state": "finished", "step": last}))
    lines = []
    for step in range(1, last + 1):
        t = step * step_time
        lines.append({"kind": "train", "step": step, "time": t, "wall_time": t, "timing/step_total": step_time,
                      "time/train_s": t})  # fmt: skip
    for i in range(n):
        step = first_eval + i
        t = step * step_time
        row = {
            "kind": "eval",
            "step": step,
            "time": t,
            "wall_time": t,
            "time/train_s": t,
            "eval_num_samples": 500,
        }
        row.update({f"eval_{k}_pass1": v[i] for k, v in accs.items()})
        lines.append(row)
    lines.sort(key=lambda x: (x["step"], x["kind"] == "train"))
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(d)


def _main(argv: list[str]) -> tuple[list[dict], str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rows = hat.main(argv)
    return rows, out.getvalue()


def test_a_fast_arm_is_compared_with_the_baseline_at_its_own_end_and_is_censored_after_it(tmp_path):
    # baseline: 4 steps of 10 s, accuracy rises 0.40 -> 0.60; fast arm: 4 steps of 5 s, 0.40 -> 0.52
    for seed in (1, 2):
        _run(tmp_path, f"base_s{seed}", 10.0, [0.40, 0.45, 0.50, 0.55, 0.60])
        _run(tmp_path, f"fast_s{seed}", 5.0, [0.40, 0.46, 0.49, 0.52, 0.52])
    rows, out = _main([
        "--arm", f"base={tmp_path}/base_s*", "--arm", f"fast={tmp_path}/fast_s*", "--eval-window", "1",
        "--fractions", "0.25", "1.0",
    ])  # fmt: skip
    base, fast = rows
    assert base["end"] == [40.0, 40.0] and fast["end"] == [20.0, 20.0]
    assert fast["final"] == [0.52, 0.52]
    assert fast["baseline_then"] == pytest.approx([0.50, 0.50])  # the baseline at 20 s, not at step 4
    assert fast["at"][0.25] == pytest.approx([0.49, 0.49])  # 10 s
    assert fast["at"][1.0] == [hat.ENDED, hat.ENDED]  # 40 s: the fast arm had stopped
    assert "| fast | 2 | 20.0 ± 0.0 | 0.520 ± 0.000 | 0.500 ± 0.000 | 0.490 ± 0.000 | ended |" in out


def test_window_3_reads_the_smoothed_curve_and_has_no_value_before_its_first_smoothed_point(tmp_path):
    # base: 0.40 .45 .50 .55 .60 every 10 s -> smoothed - .45 .50 .55 .55 (the last: median of 20-40 s)
    _run(tmp_path, "base", 10.0, [0.40, 0.45, 0.50, 0.55, 0.60])
    # a spike at 5 s: smoothed - .49 .52 .52 .52; the spike shows nowhere
    _run(tmp_path, "fast", 5.0, [0.40, 0.90, 0.49, 0.52, 0.52])
    rows, out = _main([
        "--arm", f"base={tmp_path}/base", "--arm", f"fast={tmp_path}/fast", "--fractions", "0.1", "0.25", "1.0",
    ])  # fmt: skip
    base, fast = rows
    assert base["final"] == [0.55] and fast["final"] == [0.52]
    # 4 s: before either arm's first smoothed point (base: 10 s, fast: 5 s); the old window, moved
    # forward at the start, gave .45 and .49 there, from evals not made yet
    assert base["at"][0.1] == [hat.NOT_YET] and fast["at"][0.1] == [hat.NOT_YET]
    assert fast["at"][0.25] == pytest.approx([0.52])  # 10 s: the smoothed .52, not the spike
    assert base["at"][1.0] == pytest.approx([0.55])  # 40 s: its last eval, the median of 20-40 s
    assert fast["baseline_then"] == pytest.approx([0.50])  # the baseline at the fast arm's 20 s
    assert "| base | 1 | 40.0 | 0.550 | (baseline) | not yet | 0.450 | 0.550 |" in out


def test_a_resumed_run_without_a_step_0_eval_is_not_yet_there_before_its_first_eval(tmp_path):
    _run(tmp_path, "base", 10.0, [0.40, 0.45, 0.50, 0.55, 0.60])
    _run(tmp_path, "resumed", 10.0, [0.50, 0.55, 0.60], first_eval=2)  # evals at 20, 30, 40 s
    rows, out = _main([
        "--arm", f"base={tmp_path}/base", "--arm", f"resumed={tmp_path}/resumed", "--eval-window", "1",
        "--fractions", "0.25", "0.5",
    ])  # fmt: skip
    resumed = rows[1]
    assert resumed["at"][0.25] == [hat.NOT_YET]  # 10 s: before its first eval, not "ended"
    assert resumed["at"][0.5] == pytest.approx([0.50])
    assert "| resumed | 1 | 40.0 | 0.600 | 0.600 | not yet | 0.500 |" in out


def test_the_curves_average_the_datasets_all_runs_share_and_say_which_are_left_out(tmp_path):
    # base evaluates d and e; other only d: both are read on d (not base on the mean of d and e)
    _run(tmp_path, "base", 10.0, {"d": [0.4, 0.5, 0.6], "e": [0.0, 0.0, 0.0]})
    _run(tmp_path, "other", 10.0, {"d": [0.4, 0.45, 0.5]})
    rows, out = _main(
        ["--arm", f"base={tmp_path}/base", "--arm", f"other={tmp_path}/other", "--eval-window", "1"]
    )
    assert rows[0]["final"] == [0.6] and rows[1]["final"] == [0.5]  # the old reading of base: 0.3
    assert "held-out accuracy (d, running median of 1)" in out
    assert (
        "warning: held-out accuracy is the mean over the eval datasets all runs share (d); left out: base: e"
        in out
    )


def test_arms_whose_configs_differ_are_called_not_comparable(tmp_path):
    _run(tmp_path, "base", 10.0, [0.4, 0.5, 0.6])
    _run(tmp_path, "other", 10.0, [0.4, 0.5, 0.6], lr=2e-3)
    _, out = _main(
        ["--arm", f"base={tmp_path}/base", "--arm", f"other={tmp_path}/other", "--eval-window", "1"]
    )
    assert (
        "warning: other is not comparable with base: differs in actor.learning_rate (other OpenRLHF args)"
        in out
    )


def test_a_baseline_that_ran_out_of_prompts_is_the_first_warning(tmp_path):
    reason = "the prompt data ran out after 4 of --dppo.max_steps 8 steps; raise --train.num_episodes"
    _run(
        tmp_path,
        "base",
        10.0,
        [0.4, 0.5, 0.6, 0.6, 0.6],
        status={"state": "finished", "step": 4, "reason": reason},
    )
    _run(tmp_path, "other", 5.0, [0.4, 0.5, 0.6, 0.6, 0.6])
    _, out = _main(["--arm", f"base={tmp_path}/base", "--arm", f"other={tmp_path}/other"])
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warnings[0].startswith(
        f"warning: the BASELINE base stopped early ({reason}): its final accuracy sets the target"
    )


def test_too_few_eval_points_for_the_window_say_so(tmp_path):
    _run(tmp_path, "base", 10.0, [0.4, 0.5])
    rows, out = _main(["--arm", f"base={tmp_path}/base", "--fractions", "0.5"])
    assert rows[0]["final"] == [None] and rows[0]["at"][0.5] == [hat.NOT_YET]
    assert (
        "warning: base has 2 eval point(s), fewer than --eval-window 3: it has no smoothed held-out value"
        in out
    )


def test_an_arm_glob_that_matches_nothing_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        hat.main(["--arm", f"x={tmp_path}/none_*"])
    err = capsys.readouterr().err
    assert "--arm" in err and "x=" in err and "none_*" in err
