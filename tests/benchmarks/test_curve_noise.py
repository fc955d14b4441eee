"""benchmarks/curve_noise.py on hand-made run directories: the late window, the statistics, the errors."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import curve_noise  # noqa: E402


def make_run(path: Path, accs: dict[int, float], n: int = 500) -> str:
    path.mkdir(parents=True)
    lines = [{"kind": "train", "step": s, "time/train_s": float(s)} for s in range(1, max(accs) + 1)]
    lines += [
        {"kind": "eval", "step": s, "eval_default_pass1": a, "eval_num_samples": n} for s, a in accs.items()
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_the_late_window_and_its_statistics_are_hand_checkable(tmp_path, capsys):
    accs = {0: 0.1, 10: 0.2, 20: 0.6, 30: 0.8, 40: 0.6}  # from 0.5 x 40 = step 20 on: 0.6, 0.8, 0.6
    make_run(tmp_path / "a_s1", accs)
    make_run(tmp_path / "a_s2", {0: 0.5, 10: 0.5, 20: 0.5, 30: 0.5, 40: 0.5})
    (row,) = curve_noise.main(["--arm", f"a={tmp_path}/a_s*"])
    assert row["seeds"] == 2 and row["evals"] == [3, 3]
    assert row["mean"] == pytest.approx([2 / 3, 0.5])
    assert row["sd"] == pytest.approx([statistics.stdev([0.6, 0.8, 0.6]), 0.0])
    assert row["step_change"] == pytest.approx([0.2, 0.0])
    assert row["set_se"] == pytest.approx([math.sqrt((2 / 3) * (1 / 3) / 500), math.sqrt(0.25 / 500)])
    assert "| a | 2 | 3-3 |" in capsys.readouterr().out


def test_bad_arms_and_short_runs_are_refused_naming_the_arm(tmp_path):
    make_run(tmp_path / "short", {0: 0.1, 10: 0.2})
    with pytest.raises(SystemExit):
        curve_noise.main(["--arm", f"s={tmp_path}/short"])
    with pytest.raises(SystemExit):
        curve_noise.main(["--arm", f"x={tmp_path}/none*"])
    with pytest.raises(SystemExit):
        curve_noise.main(["--arm", "no-equals-sign"])
    with pytest.raises(SystemExit):
        curve_noise.main(["--arm", f"s={tmp_path}/short", "--from-frac", "1.5"])
