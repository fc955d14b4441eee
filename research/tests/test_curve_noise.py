"""research.curve_noise on hand-made run directories (test_at_time.py's maker): the late
window, the statistics against compare's binomial SE, and bad input."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import statistics
from pathlib import Path

import pytest

from research import curve_noise

_spec = importlib.util.spec_from_file_location("_hat_tests", Path(__file__).with_name("test_at_time.py"))
_hat_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hat_tests)
make_run = _hat_tests._run  # a run directory: train lines, an eval (500 samples) per step


def _main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rows = curve_noise.main(argv)
    return rows, out.getvalue()


def test_the_late_window_and_its_statistics_are_hand_checkable(tmp_path):
    make_run(tmp_path, "a_s1", 1.0, [0.1, 0.2, 0.6, 0.8, 0.6])  # evals at steps 0-4; from step 2: 0.6 0.8 0.6
    make_run(tmp_path, "a_s2", 1.0, [0.5] * 5)
    (row,), text = _main(["--arm", f"a={tmp_path}/a_s*"])
    assert row["seeds"] == 2 and row["evals"] == [3, 3]
    assert row["mean"] == pytest.approx([2 / 3, 0.5])
    assert row["sd"] == pytest.approx([statistics.stdev([0.6, 0.8, 0.6]), 0.0])
    assert row["step_change"] == pytest.approx([0.2, 0.0])
    assert row["set_se"] == pytest.approx([math.sqrt((2 / 3) * (1 / 3) / 500), math.sqrt(0.25 / 500)])
    assert "| a | 2 | 3-3 |" in text


def test_bad_arms_and_short_runs_are_refused(tmp_path):
    make_run(tmp_path, "short", 1.0, [0.1, 0.2])
    for argv in (
        ["--arm", f"s={tmp_path}/short"],  # 2 evaluations: no window of 3
        ["--arm", f"x={tmp_path}/none*"],
        ["--arm", "no-equals-sign"],
        ["--arm", f"s={tmp_path}/short", "--from-frac", "1.5"],
    ):
        with pytest.raises(SystemExit):
            _main(argv)
