"""The demo's progress line: from the third step on it estimates the time left from the latest step times
and the evaluations still to run (`openrlhf_dppo.tiny.progress.time_left`)."""

from __future__ import annotations

import json
import subprocess

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.tiny import progress


def train(step: int, seconds: float) -> dict:
    return {R.KIND: R.TRAIN, R.STEP: step, R.STEP_TOTAL: seconds, R.REWARD_MEAN: 0.5}


def evaluation(step: int, seconds: float) -> dict:
    return {R.KIND: R.EVAL, R.STEP: step, R.EVAL_TIME: seconds}


def test_no_estimate_before_the_third_step_or_without_a_step_count():
    rows = [evaluation(0, 6.0), train(1, 9.0), train(2, 2.0)]
    assert progress.time_left(rows, 100, 10) is None
    assert progress.time_left([*rows, train(3, 4.0)], None, 10) is None


def test_steps_to_go_times_the_median_step_plus_the_evals_to_go():
    rows = [evaluation(0, 6.0), train(1, 9.0), train(2, 2.0), train(3, 4.0)]
    # 97 steps x median(9, 2, 4) = 4 s, + 10 evals (steps 10, 20, ..., 100) x 6 s
    assert progress.time_left(rows, 100, 10) == 97 * 4.0 + 10 * 6.0
    # without an eval schedule only the steps count
    assert progress.time_left(rows, 100, None) == 97 * 4.0


def test_the_eval_of_a_finished_step_counts_until_its_line_is_there():
    rows = [evaluation(0, 6.0)] + [train(s, 2.0) for s in range(1, 11)]
    # step 10 is done but its eval line not yet written: evals at 10, 20 and 30 are to go
    assert progress.time_left(rows, 30, 10) == 20 * 2.0 + 3 * 6.0
    # once it is, its time joins the mean (6 + 4) / 2 and two evals are left
    assert progress.time_left([*rows, evaluation(10, 4.0)], 30, 10) == 20 * 2.0 + 2 * 5.0


def test_only_the_latest_steps_count():
    """DPPO's steps get shorter once prompts come back and prompt pruning starts."""
    rows = [train(s, 100.0) for s in range(1, 6)] + [train(s, 2.0) for s in range(6, 16)]
    assert progress.time_left(rows, 20, None) == 5 * 2.0  # median of steps 6-15


def test_durations_read_as_minutes_and_hours():
    assert [progress.duration(s) for s in (44.6, 200, 3900)] == ["45 s", "3 min 20 s", "1 h 05 min"]


def test_follow_prints_the_estimate_on_the_step_lines(tmp_path, capsys):
    rows = [evaluation(0, 6.0), train(1, 9.0), train(2, 2.0), train(3, 4.0)]
    (tmp_path / R.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    ended = subprocess.Popen(["true"])
    ended.wait()  # a process that has ended: follow reads the file once and returns
    progress.follow(str(tmp_path), "grpo", 100, ended.pid, poll=0.0, eval_every=10)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[grpo] eval at step 0")
    assert "left" not in lines[1] and "left" not in lines[2]
    assert lines[3].startswith("[grpo] step 3/100") and lines[3].endswith("about 7 min 28 s left")  # 448 s
