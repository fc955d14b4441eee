"""benchmarks/heldout_at_time.py: held-out accuracy read at equal training time, censored past a run's end."""

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "heldout_at_time.py"
_spec = importlib.util.spec_from_file_location("heldout_at_time", PATH)
hat = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("heldout_at_time", hat)
_spec.loader.exec_module(hat)


def test_value_at_interpolates_and_is_none_outside_the_curve():
    times, values = [0.0, 10.0, 20.0], [0.4, 0.5, 0.7]
    assert hat.value_at(times, values, 5.0) == pytest.approx(0.45)
    assert hat.value_at(times, values, 20.0) == pytest.approx(0.7)
    assert hat.value_at(times, values, 20.5) is None  # the run had stopped
    assert hat.value_at(times, values, -1.0) is None


def _run(root: Path, name: str, step_time: float, accs: list[float]) -> str:
    """A run directory: one train line per step (step time ``step_time``), an eval every step from 0."""
    d = root / name
    d.mkdir()
    (d / "run_config.json").write_text(
        json.dumps({"args": {"eval": {"temperature": 0.0, "n_samples_per_prompt": 1}}})
    )
    (d / "status.json").write_text(json.dumps({"state": "finished", "step": len(accs) - 1}))
    lines = []
    for step, acc in enumerate(accs):
        t = step * step_time
        if step:
            lines.append({"kind": "train", "step": step, "time": t, "wall_time": t, "timing/step_total": step_time,
                          "time/train_s": t})  # fmt: skip
        lines.append({"kind": "eval", "step": step, "time": t, "wall_time": t, "time/train_s": t,
                      "eval_d_pass1": acc, "eval_num_samples": 500})  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(d)


def test_a_fast_arm_is_compared_with_the_baseline_at_its_own_end_and_is_censored_after_it(tmp_path):
    # baseline: 4 steps of 10 s, accuracy rises 0.40 -> 0.60; fast arm: 4 steps of 5 s, 0.40 -> 0.52
    for seed in (1, 2):
        _run(tmp_path, f"base_s{seed}", 10.0, [0.40, 0.45, 0.50, 0.55, 0.60])
        _run(tmp_path, f"fast_s{seed}", 5.0, [0.40, 0.46, 0.49, 0.52, 0.52])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rows = hat.main([
            "--arm", f"base={tmp_path}/base_s*", "--arm", f"fast={tmp_path}/fast_s*", "--eval-window", "1",
            "--fractions", "0.25", "1.0",
        ])  # fmt: skip
    base, fast = rows
    assert base["end"] == [40.0, 40.0] and fast["end"] == [20.0, 20.0]
    assert fast["final"] == [0.52, 0.52]
    assert fast["baseline_then"] == pytest.approx([0.50, 0.50])  # the baseline at 20 s, not at step 4
    assert fast["at"][0.25] == pytest.approx([0.49, 0.49])  # 10 s
    assert fast["at"][1.0] == [None, None]  # 40 s: the fast arm had stopped
    assert (
        "| fast | 2 | 20.0 ± 0.0 | 0.520 ± 0.000 | 0.500 ± 0.000 | 0.490 ± 0.000 | ended |" in out.getvalue()
    )


def test_an_arm_glob_that_matches_nothing_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        hat.main(["--arm", f"x={tmp_path}/none_*"])
    assert "--arm" in capsys.readouterr().err
