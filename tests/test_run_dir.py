"""The run-directory module: the writer's time keys, the cut-back on a resume, status.json, and the one
reader every consumer uses. A clock stand-in makes every time exact."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.launch import slurm
from openrlhf_dppo.report import load_run
from openrlhf_dppo.tiny import progress

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock(1000.0)
    monkeypatch.setattr(R, "time", c)
    return c


def _config(run: R.RunDir, start_time: float) -> None:
    args = SimpleNamespace(train=SimpleNamespace(seed=1))
    run.write_config(args, SimpleNamespace(asdict=lambda: {"method": "grpo"}), "grpo", ["x"], start_time)


def _steps(run: R.RunDir, clock: Clock, steps, step_total: float = 2.0) -> None:
    for step in steps:
        clock.now += step_total
        run.log(R.TRAIN, step, {R.STEP_TOTAL: step_total})


def _lines(path: Path, name: str = R.METRICS) -> list[dict]:
    return [json.loads(line) for line in (path / name).read_text().splitlines()]


def test_the_writer_adds_training_time_and_startup(tmp_path, clock):
    run = R.RunDir(tmp_path, max_steps=3)
    _config(run, start_time=990.0)  # the process started 10 s before the writer
    run.log(R.EVAL, 0, {"eval_arith_pass1": 0.25})  # before the first step: no training time yet
    clock.now = 1030.0  # 30 s of model loading, engine start...
    _steps(run, clock, [1, 2, 3], step_total=4.0)
    run.log(R.EVAL, 3, {"eval_arith_pass1": torch.tensor(0.5), "timing/eval": 1.5})
    lines = _lines(tmp_path)
    assert [(x[R.KIND], x[R.STEP], x[R.TRAIN_S]) for x in lines] == [
        ("eval", 0, 0.0),
        ("train", 1, 4.0),
        ("train", 2, 8.0),
        ("train", 3, 12.0),
        ("eval", 3, 12.0),
    ]
    # start-up: the first step began at 1034 - 4 = 1030, 40 s after the process start; once only
    assert lines[1][R.STARTUP_S] == 40.0 and all(R.STARTUP_S not in x for x in lines[2:])
    assert lines[4]["eval_arith_pass1"] == 0.5 and lines[1][R.WALL_TIME] == 34.0
    config = json.loads((tmp_path / R.RUN_CONFIG).read_text())
    assert config["start_time"] == 990.0 and config["args"] == {"train": {"seed": 1}}


def test_a_resume_cuts_the_file_back_to_the_checkpoint(tmp_path, clock):
    first = R.RunDir(tmp_path, max_steps=6)
    _config(first, start_time=1000.0)
    first.log(R.EVAL, 0, {"eval_arith_pass1": 0.25})
    _steps(first, clock, [1, 2, 3, 4])
    first.log(R.EVAL, 4, {"eval_arith_pass1": 0.5})
    _steps(first, clock, [5])
    with open(tmp_path / R.METRICS, "a") as fh:  # killed while writing step 6
        fh.write('{"kind": "train", "step": 6, "timin')
    # the restart (checkpoint at step 3): a new process, a new writer
    clock.now = 2000.0
    second = R.RunDir(tmp_path, max_steps=6)
    _config(second, start_time=1990.0)
    assert second.resume(3) == 4  # train 4, eval 4, train 5, the half-written 6
    clock.now = 2005.0
    _steps(second, clock, [4, 5, 6])
    lines = _lines(tmp_path)
    train = [x for x in lines if x[R.KIND] == R.TRAIN]
    # one line per step, training time continuing from step 3's 6 s: monotone
    assert [x[R.STEP] for x in train] == [1, 2, 3, 4, 5, 6]
    assert [x[R.TRAIN_S] for x in train] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert [(x[R.KIND], x[R.STEP]) for x in lines if x[R.KIND] == R.EVAL] == [("eval", 0)]
    # the restart's start-up: its first step began at 2007 - 2 = 2005, 15 s after its process start
    assert train[3][R.STARTUP_S] == 15.0
    cut = (tmp_path / f"{R.METRICS}.replaced-1").read_text().splitlines()
    assert [json.loads(x)[R.STEP] for x in cut[:3]] == [4, 4, 5] and cut[3].startswith(
        '{"kind": "train", "step": 6'
    )
    # the report reads it as a run with a continuous training time and no repeated steps
    (tmp_path / R.STATUS).write_text(json.dumps({"state": "finished", "step": 6}))
    assert load_run(tmp_path).notes == []


def test_a_fresh_start_moves_old_lines_aside_but_keeps_its_own(tmp_path, clock):
    old = R.RunDir(tmp_path)
    old.log(R.EVAL, 0, {"eval_arith_pass1": 0.125})
    _steps(old, clock, [1, 2])  # an attempt that never saved a checkpoint
    new = R.RunDir(tmp_path)
    new.log(R.EVAL, 0, {"eval_arith_pass1": 0.25})  # written by this process before the restore
    assert new.resume(0) == 3  # the old step-0 eval too: this process evaluated step 0 again
    assert [(x[R.KIND], x[R.STEP], x["eval_arith_pass1"]) for x in _lines(tmp_path)] == [("eval", 0, 0.25)]
    assert new.train_s == 0.0 and not (tmp_path / R.STATUS).exists()
    assert new.resume(0) == 0 and not (tmp_path / f"{R.METRICS}.replaced-2").exists()  # nothing left to cut


def test_resume_continues_older_files_without_train_s(tmp_path):
    rows = [{"kind": "train", "step": s, R.STEP_TOTAL: 1.5} for s in (1, 2, 2, 3)]  # step 2 twice
    (tmp_path / R.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = R.RunDir(tmp_path)
    assert run.resume(3) == 0 and run.train_s == 4.5  # one line per step: 1.5 x 3


def test_status_json(tmp_path):
    R.write_status(tmp_path, "running", 4, max_steps=10)
    status = R.read_status(tmp_path)
    assert (status["state"], status["step"], status["max_steps"]) == ("running", 4, 10)
    # a launcher that knows neither the step nor max_steps keeps them; the reason is recorded
    R.write_status(tmp_path, "failed", None, reason="trainer exited with -9")
    status = R.read_status(tmp_path)
    assert (status["state"], status["step"], status["max_steps"]) == ("failed", 4, 10)
    assert status["reason"] == "trainer exited with -9"
    for state in ("cancelled", "requeued", "finished"):
        assert R.write_status(tmp_path, state, 5)["state"] == state
    assert "reason" not in R.read_status(tmp_path)
    with pytest.raises(
        ValueError,
        match="status state must be one of running, interrupted, finished, failed, cancelled, requeued",
    ):
        R.write_status(tmp_path, "done", 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temporary file left
    assert R.read_status(tmp_path / "nope") is None
    (tmp_path / R.STATUS).write_text("{")
    with pytest.raises(ValueError, match="status.json: not valid JSON"):
        R.read_status(tmp_path)


def test_to_plain_handles_tensors_and_arrays_without_importing_torch():
    ns = SimpleNamespace(a=torch.tensor(0.25), b=torch.tensor([1, 2]), c=np.float32(0.5), d=np.arange(3))
    plain = R.to_plain({"x": ns, "nan": float("nan"), "inf": torch.tensor(math.inf), "t": (1, None, True)})
    assert plain == {
        "x": {"a": 0.25, "b": [1, 2], "c": 0.5, "d": [0, 1, 2]},
        "nan": "nan",
        "inf": "inf",
        "t": [1, None, True],
    }
    json.dumps(plain)  # valid JSON


def test_every_reader_skips_a_half_written_last_line_the_same_way(tmp_path, rundirs):
    rows = rundirs.train_rows([(2.0, 1.0, 0.75, 0.25)] * 3, [0.0, 0.25, 0.5])
    run_dir = rundirs.write_run(
        tmp_path / "live", rows, status="running", extra_lines=['{"kind": "train", "st']
    )
    notes = []
    expected = [r["step"] for r in rows]
    assert [r["step"] for r in R.read_metrics(run_dir, notes)] == expected
    assert notes == ["metrics.jsonl: skipped a partial last line (4)"]
    # the launcher and the tiny progress printer use that very function; the report goes through it
    assert slurm.read_metrics is R.read_metrics and progress.read_metrics is R.read_metrics
    run = load_run(run_dir)
    assert [r["step"] for r in run.train] == expected and run.notes == notes


def test_no_other_module_opens_metrics_jsonl():
    """The path is spelled once (run_dir.METRICS): every other module reads through read_metrics."""
    spelled = []
    for path in sorted([*REPO.glob("openrlhf_dppo/**/*.py"), *REPO.glob("benchmarks/*.py")]):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if node.value.endswith("metrics.jsonl"):
                    spelled.append(str(path.relative_to(REPO)))
    assert spelled == ["openrlhf_dppo/run_dir.py"]


def test_core_and_the_run_dir_take_the_key_names_from_metric_keys():
    """One spelling: core/estimator.py (torch) and run_dir (re-exporting every name) use metric_keys'."""
    from openrlhf_dppo import core
    from openrlhf_dppo import metric_keys as K
    from openrlhf_dppo.core import estimator as M

    names = [n for n in dir(K) if n.isupper()]
    assert len(names) > 50 and all(getattr(R, n) is getattr(K, n) for n in names)
    assert all(getattr(M, n) is getattr(K, n) for n in names if hasattr(M, n))
    assert core.REQUIRED_KEYS is K.REQUIRED_KEYS


def test_one_reader_of_json_objects_and_one_error_for_the_launcher_and_the_report(tmp_path):
    # run_config.json / status.json / eval_results.json all go through run_dir.read_json_object: the
    # launcher (read_status) and the report (load_run) fail on a broken file with the same error
    (tmp_path / R.RUN_CONFIG).write_text("{}")
    (tmp_path / R.STATUS).write_text("[1]")
    with pytest.raises(R.RunDirError, match=r"status.json: expected a JSON object, found list") as launcher:
        R.read_status(tmp_path)
    with pytest.raises(R.RunDirError, match=r"status.json: expected a JSON object, found list") as report:
        load_run(tmp_path)
    assert type(launcher.value) is type(report.value) and isinstance(report.value, ValueError)
