"""compare --lossless / --at-time / --curve-noise: the analyses of report.lossless, report.at_time and
report.curve_noise on compare's own arms, the same tables as their own commands print, in the console
and in report.md."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

from openrlhf_dppo.cli import compare
from openrlhf_dppo.report import at_time, curve_noise, lossless

_spec = importlib.util.spec_from_file_location("_ll_tests", Path(__file__).with_name("test_lossless.py"))
_ll = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ll)


def _out(fn, argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = fn(argv)
    return rc, buf.getvalue()


def test_compare_prints_the_same_tables_as_the_analyses_and_writes_them_to_the_report(tmp_path):
    for seed in (1, 2):
        _ll.make_run(tmp_path, f"g_s{seed}", [0.5, 0.5, 0.25, 0.25, 0.0])
        _ll.make_run(tmp_path, f"d_s{seed}", [0.25, 0.25, 0.0, 0.0, 0.0], [0.5] * 5)
    arms = ["--arm", f"g={tmp_path}/g_s*", "--arm", f"d={tmp_path}/d_s*"]
    out = tmp_path / "rep"
    rc, text = _out(compare.main, [*arms, "--baseline", "g", "--eval-window", "1", "--lossless",
                                   "--at-time", "0.5", "1.0", "--curve-noise", "--out", str(out)])  # fmt: skip
    assert rc == 0
    _, ll = _out(lossless.main, arms)
    _, at = _out(at_time.main, [*arms, "--baseline", "g", "--eval-window", "1", "--fractions", "0.5", "1.0"])
    _, cn = _out(curve_noise.main, arms)
    report_md = (out / "report.md").read_text()
    for own in (ll, at, cn):
        table = [line for line in own.splitlines() if not line.startswith("warning:")]
        assert "\n".join(table) in text and "\n".join(table) in report_md
    assert "## More analyses" in report_md


def test_a_table_the_runs_cannot_give_says_why_and_compare_still_succeeds(tmp_path):
    _ll.make_run(tmp_path, "old", [None, None, None])
    rc, text = _out(compare.main, [str(tmp_path / "old"), "--lossless", "--curve-noise", "1.5"])
    assert rc == 0
    assert "lossless limit: not told (--arm old: run old does not log rollout/equal_reward_frac_ht" in text
    assert "curve noise: --curve-noise must be in [0, 1), got 1.5" in text
