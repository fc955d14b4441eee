"""load_run: what a run directory must hold, what a run in progress may lack."""

from __future__ import annotations

import json

import pytest

from openrlhf_dppo.report import RunDirError, Settings, build_report, load_run
from openrlhf_dppo.report.comparability import arm_key


def test_a_finished_run(grpo_dir):
    run = load_run(grpo_dir)
    assert (run.name, run.state, run.in_progress, run.algo) == ("grpo", "finished", False, "grpo")
    assert [r["step"] for r in run.train] == [1, 2, 3, 4, 5] and run.evals == []
    assert run.eval_results["average"]["avg@k"] == 0.375
    assert run.series("timing/step_total") == ([1, 2, 3, 4, 5], [10.0, 4.0, 4.0, 5.0, 4.0])
    assert run.notes == []


def test_eval_lines_are_kept_apart_from_train_lines(dppo_dir):
    run = load_run(dppo_dir)
    assert [r["step"] for r in run.train] == [1, 2, 3, 4, 5]
    assert run.evals == [
        {"kind": "eval", "step": 2, "time": 0.0, "wall_time": 10.0, "eval_math500_pass1": 0.25}
    ]


def test_missing_directory_and_files(tmp_path, grpo_dir):
    with pytest.raises(RunDirError, match="run directory not found: .*nope"):
        load_run(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="not a directory"):
        load_run(tmp_path / "file")
    (grpo_dir / "metrics.jsonl").unlink()
    with pytest.raises(RunDirError, match="missing metrics.jsonl"):
        load_run(grpo_dir)
    (grpo_dir / "run_config.json").unlink()
    with pytest.raises(RunDirError, match="missing run_config.json"):
        load_run(grpo_dir)


def test_broken_files_are_named(grpo_dir):
    text = (grpo_dir / "metrics.jsonl").read_text().splitlines()
    text.insert(1, '{"kind": "train", "step": 9')  # cut short by a kill, then more lines appended
    (grpo_dir / "metrics.jsonl").write_text("\n".join(text) + "\n")
    run = load_run(grpo_dir)  # the one reader skips it, as every consumer does, and says so
    assert [r["step"] for r in run.train] == [1, 2, 3, 4, 5]
    assert run.notes == ["metrics.jsonl: skipped a line that is not a JSON object (2)"]
    (grpo_dir / "metrics.jsonl").write_text(
        '{"kind": "train", "step": "one"}\n{"kind": "train", "step": 2}\n'
    )
    with pytest.raises(RunDirError, match="a line with kind=train has step='one', not an integer"):
        load_run(grpo_dir)
    (grpo_dir / "status.json").write_text("[1, 2]")
    (grpo_dir / "metrics.jsonl").write_text("")
    with pytest.raises(RunDirError, match="status.json: expected a JSON object"):
        load_run(grpo_dir)


def test_in_progress_without_status_and_partial_last_line(tmp_path, rundirs):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES[:2], rundirs.GRPO_REWARD)
    live = rundirs.write_run(tmp_path / "live", rows, status=None, extra_lines=['{"kind": "tra'])
    run = load_run(live)
    assert run.state == "running" and run.in_progress
    assert run.describe_state() == "in progress (step 2)"
    assert len(run.train) == 2
    assert run.notes == [
        "metrics.jsonl: skipped a partial last line (3)",
        "no status.json: taken as in progress",
    ]


def test_in_progress_with_no_steps_yet(tmp_path, rundirs, grpo_dir):
    empty = rundirs.write_run(tmp_path / "empty", [], status="running")
    run = load_run(empty)
    assert run.describe_state() == "in progress (step 0/5)"
    rep = build_report([load_run(grpo_dir), run], Settings())
    c = rep.comparisons[0]
    assert c.step_speedup is None and c.ttt_ratio is None
    assert "empty has no training steps in metrics.jsonl yet" in rep.warnings
    assert "empty is in progress (step 0/5): its numbers are partial" in rep.warnings
    # as the baseline, there is no target and no speedup, still no exception
    rep = build_report([run, load_run(grpo_dir)], Settings())
    assert rep.summaries[0].final_reward is None and rep.comparisons[0].step_speedup is None


def test_failed_run_and_duplicate_steps(tmp_path, rundirs, grpo_dir):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    resumed = dict(rows[2], **{"timing/step_total": 99.0})  # step 3 logged again after a resume
    run_dir = rundirs.write_run(tmp_path / "crashed", rows + [resumed], status="failed")
    run = load_run(run_dir)
    assert run.state == "failed" and not run.in_progress
    assert run.series("timing/step_total")[1] == [10.0, 4.0, 99.0, 5.0, 4.0]  # the last line for a step wins
    rep = build_report([load_run(grpo_dir), run], Settings())
    assert "crashed ended with state 'failed': its numbers are partial" in rep.warnings
    assert "crashed: metrics.jsonl: step 3 (train) logged 2 times, kept the last" in rep.warnings


def test_missing_keys_fall_back(tmp_path, rundirs, grpo_dir):
    """Without time/train_s (or wall_time) the cumulative step time is the clock; without dppo/* keep
    fractions the counts give them; without either nothing is taken as pruned."""
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    for row in rows:
        del row["wall_time"]
        row.update(
            {"prompts/drawn": 8, "prompts/rolled_out": 6, "samples/generated": 24, "samples/trained": 12}
        )
    run = load_run(rundirs.write_run(tmp_path / "counts", rows))
    rep = build_report([load_run(grpo_dir), run], Settings())
    s = rep.summaries[1]
    # cumulative totals 10, 14, 18, 23, 27 equal the fixture's wall times
    assert s.reward_times == [10.0, 14.0, 18.0, 23.0, 27.0]
    # keep fractions 6 / 8 = .75 and 12 / 24 = .5 -> r_q = .25, r_o = .5
    assert (rep.comparisons[0].r_q, rep.comparisons[0].r_o) == (0.25, 0.5)
    assert (
        s.keep_source
        == "prompts: prompts/rolled_out / prompts/drawn, completions: samples/trained / samples/generated"
    )
    assert (
        rep.summaries[0].keep_source
        == "prompts: none logged (taken as 1), completions: samples/trained / samples/generated"
    )
    assert rep.summaries[0].prompt_keep == 1.0  # GRPO fixture logs no prompt counts: nothing pruned
    assert "counts: no time/train_s: training time = cumulative timing/step_total" in rep.warnings


def test_run_config_algo_fallback(grpo_dir):
    cfg = json.loads((grpo_dir / "run_config.json").read_text())
    del cfg["algo"]
    cfg["dppo"]["method"] = "dppo"
    (grpo_dir / "run_config.json").write_text(json.dumps(cfg))
    assert load_run(grpo_dir).algo == "dppo"


@pytest.mark.parametrize("enable, method", [(True, "dppo"), (False, "grpo")])
def test_a_run_config_written_before_dppo_method_is_read(tmp_path, rundirs, enable, method):
    # runs written before --dppo.method record --dppo.enable true/false (config, args), and maybe no algo
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    new = rundirs.write_run(tmp_path / "new", rows, algo=method, dppo={"method": method, "seed": 1})
    old = rundirs.write_run(tmp_path / "old", rows, algo=method, dppo={"enable": enable, "seed": 1})
    cfg = json.loads((old / "run_config.json").read_text())
    del cfg["algo"]
    cfg["args"]["dppo"] = {"enable": enable, "seed": 1}
    cfg["argv"] += ["--dppo.enable", str(enable).lower()]
    (old / "run_config.json").write_text(json.dumps(cfg))
    new_cfg = json.loads((new / "run_config.json").read_text())
    new_cfg["args"]["dppo"] = {"method": method, "seed": 1}
    (new / "run_config.json").write_text(json.dumps(new_cfg))
    run = load_run(old)
    assert run.algo == method
    assert run.config["dppo"] == {"method": method, "seed": 1} and run.config["args"]["dppo"] == {
        "method": method,
        "seed": 1,
    }
    assert run.config["argv"][-2:] == ["--dppo.enable", str(enable).lower()]  # as it was run
    # an old and a new run of one arm are one arm
    assert arm_key(run.config) == arm_key(load_run(new).config)


def test_resumed_run_training_time_leaves_out_the_restart(tmp_path, rundirs, grpo_dir):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)  # wall 10, 14, 18, 23, 27
    rows[3]["wall_time"], rows[4]["wall_time"] = 6.0, 10.0  # restarted after step 3: 1 s start-up + 5, + 4
    resumed = rundirs.write_run(tmp_path / "resumed", rows[:3] + [{"kind": "resume", "step": 3}] + rows[3:])
    rep = build_report([load_run(grpo_dir), load_run(resumed)], Settings())
    s = rep.summaries[1]
    # training time is the sum of the step times: the restart's second of start-up is not in it
    assert s.reward_times == [10.0, 14.0, 18.0, 23.0, 27.0] and s.train_time == 27.0


def test_warmup_skips_steps_not_values(tmp_path, rundirs, grpo_dir):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    for row, keep in zip(rows[1:], [0.25, 0.5, 0.5, 0.5]):  # logged from step 2 on
        row["dppo/prompt_keep_frac"] = keep
    run = load_run(rundirs.write_run(tmp_path / "late_keys", rows))
    rep = build_report([load_run(grpo_dir), run], Settings(warmup=1))
    # warm-up drops step 1 (which has no keep fraction), not the first logged value:
    # mean(.25, .5, .5, .5) = .4375 -> r_q = .5625
    assert rep.comparisons[0].r_q == 0.5625


def test_started_run_without_metrics_yet(tmp_path, rundirs, grpo_dir, capsys):
    from openrlhf_dppo.cli.main import main

    started = rundirs.write_run(tmp_path / "started", [], status="running")
    (started / "metrics.jsonl").unlink()  # the trainer writes it after its first step
    run = load_run(started)
    assert run.in_progress and run.train == [] and run.notes == ["no metrics.jsonl yet"]
    assert main(["compare", str(grpo_dir), str(started)]) == 0
    assert "started is in progress (step 0/5): its numbers are partial" in capsys.readouterr().out
    # without a status saying "running", a missing metrics.jsonl is an error that says why
    (started / "status.json").unlink()
    with pytest.raises(
        RunDirError, match=r"started: missing metrics.jsonl \(no status.json; a run that has just"
    ):
        load_run(started)
