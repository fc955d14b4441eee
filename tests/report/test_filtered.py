"""GRPO + dynamic filtering in the compare report and the progress lines: the completions its filter
dropped are filtered, not pruned. They are counted as such (tokens filtered), and the fraction of
generated completions not trained (r_o, which the ideal-speedup formula needs) says where it came from."""

from __future__ import annotations

import pytest

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report.tables import speedup_table, work_table
from openrlhf_dppo.tiny import progress


def _df_extra(steps: int = 5) -> dict[int, dict]:
    """A dynamic-filtering step: 96 samples generated (3 x GRPO's 32), 32 trained, 64 filtered."""
    return {
        i: {
            "tokens/generated": 300.0,
            "tokens/trained": 100.0,
            "tokens/pruned": 0.0,
            "tokens/filtered": 200.0,
            "samples/generated": 96.0,
            "samples/trained": 32.0,
            "samples/pruned": 0.0,
            "samples/filtered": 64.0,
        }
        for i in range(steps)
    }


def _df_run(tmp_path, rundirs):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD, _df_extra())
    return rundirs.write_run(tmp_path / "df", rows, algo="grpo")


def _columns(table):
    title, headers, rows = table
    return title, [dict(zip(headers, row)) for row in rows]


def test_work_table_counts_filtered_tokens_and_marks_the_rate_as_filtered(
    grpo_dir, dppo_dir, tmp_path, rundirs
):
    df = _df_run(tmp_path, rundirs)
    report = build_report([load_run(grpo_dir), load_run(dppo_dir), load_run(df)], Settings(warmup=1))
    title, rows = _columns(work_table(report))
    by_run = {row["run"]: row for row in rows}
    # 5 steps x 200 filtered tokens; none pruned
    assert by_run["df"]["tokens filtered"] == "1,000"
    assert by_run["df"]["tokens pruned"] == "0"
    # 1 - 32 / 96 = 0.667 of the generated completions not trained, by the filter
    assert by_run["df"]["completions not trained r_o"] == "0.667 (cfg GRPO), filtered, not pruned"
    # DPPO's r_o is its pruning (dppo/completion_keep_frac); runs that log no filtered tokens show a dash
    assert by_run["dppo"]["completions not trained r_o"] == "0.500 (cfg 0.5)"
    assert by_run["dppo"]["tokens filtered"] == "—" and by_run["grpo"]["tokens filtered"] == "—"
    assert "dynamic filtering" in title


def test_a_run_that_logs_zero_filtered_is_not_marked(grpo_dir, tmp_path, rundirs):
    extra = {i: {"tokens/filtered": 0.0, "samples/filtered": 0.0} for i in range(5)}
    plain = rundirs.write_run(
        tmp_path / "plain", rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD, extra), algo="grpo"
    )
    report = build_report([load_run(grpo_dir), load_run(plain)], Settings(warmup=1))
    _, rows = _columns(work_table(report))
    plain_row = next(row for row in rows if row["run"] == "plain")
    assert plain_row["tokens filtered"] == "0"
    assert plain_row["completions not trained r_o"] == "0.000 (cfg GRPO)"


def test_a_rate_set_on_the_fly_is_shown_as_its_rule_not_as_its_first_value(grpo_dir, tmp_path, rundirs):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD, {})
    cfg = {"method": "dppo", "prompt_prune_rate": 0.5, "completion_prune_rate": 0.0}
    fixed = rundirs.write_run(tmp_path / "fixed", rows, algo="dppo", dppo=cfg)
    zs = rundirs.write_run(
        tmp_path / "zs", rows, algo="dppo", dppo={**cfg, "prompt_rate_control": "zero-share"}
    )
    report = build_report([load_run(grpo_dir), load_run(fixed), load_run(zs)], Settings(warmup=1))
    _, table = _columns(work_table(report))
    by_run = {row["run"]: row["prompt prune rate r_q"] for row in table}
    assert by_run["fixed"].endswith(" (cfg 0.5)")  # a run without the field: a fixed rate
    assert by_run["zs"].endswith(" (cfg zero-share from 0.5)")


def test_a_grpo_run_is_labelled_grpo_whatever_dppo_rates_it_recorded(grpo_dir, tmp_path, rundirs):
    # a GRPO run (--dppo.method grpo) records the --dppo.* defaults, zero-share from 0.5; its rates pruned
    # nothing, and the table must not read as DPPO's
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD, {})
    cfg = {"method": "grpo", "prompt_rate_control": "zero-share", "prompt_prune_rate": 0.5}
    grpo = rundirs.write_run(
        tmp_path / "grpo_zs", rows, algo="grpo", dppo={**cfg, "completion_prune_rate": 0.3}
    )
    report = build_report([load_run(grpo_dir), load_run(grpo)], Settings(warmup=1))
    _, table = _columns(work_table(report))
    row = next(row for row in table if row["run"] == "grpo_zs")
    assert row["prompt prune rate r_q"] == "0.000 (cfg GRPO)"
    assert row["completions not trained r_o"] == "0.000 (cfg GRPO)"


def test_speedup_table_uses_the_filtered_fraction_as_r_o(grpo_dir, tmp_path, rundirs):
    df = _df_run(tmp_path, rundirs)
    report = build_report([load_run(grpo_dir), load_run(df)], Settings(warmup=1))
    c = report.comparisons[0]
    # g = 96 / 32 samples generated a step; r_o = 1 - 32/96; training done = g (1 - r_o) = 1 x GRPO's
    assert c.rollout == pytest.approx(3.0)
    assert c.r_o == pytest.approx(2.0 / 3.0)
    title, headers, _ = speedup_table(report)
    assert "dynamic filtering" in title and "r_o" in headers


def test_progress_line_and_summary_show_filtered_tokens(tmp_path, rundirs, capsys):
    row = dict(_df_extra(1)[0], step=3, **{R.STEP_TOTAL: 2.0, "rollout/reward_mean": 0.5})
    line = progress.step_line("df", row, 10)
    assert "tokens gen 300 / trained 100 / pruned 0 / filtered 200" in line
    no_filter = dict(row, **{"tokens/filtered": 0.0})
    assert "filtered" not in progress.step_line("grpo", no_filter, 10)
    grpo = rundirs.curve_run(tmp_path / "grpo", step_time=4.0, evals=[0.25, 0.3, 0.35])
    progress.print_summary([str(grpo), str(_df_run(tmp_path, rundirs))])
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if "tok generated" in line)
    assert lines[at].split()[-5:-3] == ["pruned", "filtered"]
    df_row = next(line for line in lines[at:] if line.startswith("df "))
    # tokens: generated 1500, trained 500, pruned 0, filtered 1000
    assert df_row.split()[6:10] == ["1500", "500", "0", "1000"]
