"""research.lossless on hand-made run directories (test_at_time.py's maker, with
the equal-reward share and step times written into the train lines): the time-weighted ratio by hand,
the halves, the spread over seeds, and bad input."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest

from research import lossless as lossless_limit

_spec = importlib.util.spec_from_file_location("_hat_tests_ll", Path(__file__).with_name("test_at_time.py"))
_hat_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_hat_tests)


def make_run(root: Path, name: str, shares: list[float | None], times: list[float] | None = None) -> str:
    """A run of len(shares) steps; step i carries share shares[i - 1] (None: the key left out) and
    step time times[i - 1] (default 1 s)."""
    d = Path(_hat_tests._run(root, name, 1.0, [0.5] * (len(shares) + 1)))
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for row in lines:
        if row["kind"] == "train":
            i = row["step"] - 1
            if shares[i] is not None:
                row["rollout/equal_reward_frac_ht"] = shares[i]
                row["rollout/equal_reward_frac"] = shares[i] / 2  # what a selection rolled out
            if times is not None:
                row["timing/step_total"] = times[i]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(d)


def _main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rows = lossless_limit.main(argv)
    return rows, out.getvalue()


def test_the_ratio_is_weighted_by_step_time_and_leaves_out_the_warm_up(tmp_path):
    # step 1 is warm-up (its share 0.9 must not count); steps 2-5: shares 0.5, 0.5, 0.0, 0.0 taking
    # 1, 1, 2, 4 s: the oracle takes 0.5 + 0.5 + 2 + 4 = 7 of 8 s -> 0.875 (an unweighted mean: 0.75)
    make_run(tmp_path, "g_s1", [0.9, 0.5, 0.5, 0.0, 0.0], [9.0, 1.0, 1.0, 2.0, 4.0])
    (row,), text = _main(["--arm", f"g={tmp_path}/g_s*"])
    assert row["steps"] == [4]
    assert row["time_ratio"] == [pytest.approx(0.875, abs=1e-12)]
    assert row["speedup"] == [pytest.approx(8 / 7, abs=1e-12)]
    assert row["share"] == [pytest.approx(0.25)]
    assert row["share_first_half"] == [pytest.approx(0.5)] and row["share_second_half"] == [0.0]
    assert row["rolled_out_share"] == [pytest.approx(0.125)]
    assert "| g | 1 | 4 | 0.250 | 0.500 | 0.000 | 0.125 | 0.875 | 1.14x |" in text
    (row,), _ = _main(["--arm", f"g={tmp_path}/g_s*", "--warmup", "0"])
    assert row["steps"] == [5] and row["share"] == [pytest.approx(1.9 / 5)]


def test_seeds_give_a_mean_sd_and_range_and_arms_stay_apart(tmp_path):
    make_run(tmp_path, "g_s1", [0.0, 0.2, 0.2])
    make_run(tmp_path, "g_s2", [0.0, 0.6, 0.6])
    make_run(tmp_path, "d_s1", [0.0, 0.1, 0.1])
    rows, text = _main(["--arm", f"g={tmp_path}/g_s*", "--arm", f"d={tmp_path}/d_s*"])
    by_arm = {r["arm"]: r for r in rows}
    assert by_arm["g"]["seeds"] == 2 and by_arm["d"]["seeds"] == 1
    assert by_arm["g"]["time_ratio"] == [pytest.approx(0.8), pytest.approx(0.4)]
    assert "0.600 ± 0.283 (0.400-0.800)" in text  # mean, sample sd sqrt(0.08), range
    assert by_arm["d"]["time_ratio"] == [pytest.approx(0.9)]


def test_runs_without_the_share_are_refused_by_name(tmp_path, capsys):
    make_run(tmp_path, "old_s1", [None, None, None])
    with pytest.raises(SystemExit):
        _main(["--arm", f"old={tmp_path}/old_s*"])
    assert "run old_s1 does not log rollout/equal_reward_frac_ht" in capsys.readouterr().err
    make_run(tmp_path, "mixed_s1", [0.1, None, 0.3])
    with pytest.raises(SystemExit):
        _main(["--arm", f"mixed={tmp_path}/mixed_s*"])
    assert "run mixed_s1 does not log rollout/equal_reward_frac_ht" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _main(["--arm", f"mixed={tmp_path}/mixed_s*", "--warmup", "-1"])
    assert "--warmup must be >= 0" in capsys.readouterr().err
