"""Data preparation: shipped problems, local copies of the real layouts, the offline error."""

import json
import os
import subprocess
import sys

import pytest

from openrlhf_dppo.data.prepare import DEFAULT_INSTRUCTION, DataError, last_boxed, main, prepare
from openrlhf_dppo.rewards.math_reward import MathReward


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_shipped_problems(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--train", "demo_train", "--eval", "demo_eval"]) == 0
    assert "demo_train:     32 problems" in capsys.readouterr().out
    train, evals = _read(tmp_path / "demo_train.jsonl"), _read(tmp_path / "demo_eval.jsonl")
    assert (len(train), len(evals)) == (32, 16)
    reward = MathReward()
    for rec in train + evals:
        assert set(rec) == {"prompt", "answer", "datasource", "problem"}
        assert rec["prompt"] == rec["problem"] + "\n" + DEFAULT_INSTRUCTION
        # every shipped label is one the reward can read, and its boxed form scores 1
        assert reward.judge(f"so \\boxed{{{rec['answer']}}}", rec["answer"])[0] == "correct", rec
    assert {r["datasource"] for r in evals} == {"demo_eval"}
    # no overlap between the shipped training and evaluation problems
    assert not {r["problem"] for r in train} & {r["problem"] for r in evals}


def test_last_boxed_extracts_balanced_content():
    assert last_boxed(r"so $\boxed{\frac{1}{2}}$ and") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("no box") is None


def test_local_copies_of_the_real_layouts(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    # MATH: the label is the last box of the worked solution
    rows = [
        {"problem": "P1", "solution": r"We get $\boxed{\dfrac{\sqrt{3}}{2}}$.", "level": "Level 2"},
        {"problem": "P0", "solution": "a solution without a boxed answer"},  # left out
    ]
    (local / "math.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    # GSM8K: the label follows ####, thousands separators dropped
    (local / "gsm8k.jsonl").write_text(json.dumps({"question": "Q", "answer": "steps\n#### 1,250"}))
    # OlympiadBench: final_answer is a list with dollar signs
    (local / "olympiadbench.json").write_text(
        json.dumps([{"question": "Q2", "final_answer": ["$3$", "$-1$"]}])
    )
    # AMC: float answers
    (local / "amc23.jsonl").write_text(json.dumps({"question": "Q3", "answer": 27.0}))
    written = prepare(
        ["math", "gsm8k", "olympiadbench", "amc23"], str(tmp_path / "out"), local_dir=str(local)
    )
    labels = {name: _read(path)[0]["answer"] for name, (path, _) in written.items()}
    assert {name: n for name, (_, n) in written.items()} == {
        "math": 1,
        "gsm8k": 1,
        "olympiadbench": 1,
        "amc23": 1,
    }
    assert labels == {
        "math": r"\dfrac{\sqrt{3}}{2}",
        "gsm8k": "1250",
        "olympiadbench": "3, -1",
        "amc23": "27",
    }
    # --source NAME=PATH: any file under any name
    written = prepare(["mine"], str(tmp_path / "out"), sources={"mine": str(local / "amc23.jsonl")})
    assert _read(written["mine"][0])[0] == {
        "prompt": "Q3\n" + DEFAULT_INSTRUCTION,
        "answer": "27",
        "datasource": "mine",
        "problem": "Q3",
    }


def test_unknown_layout_and_name_are_clear_errors(tmp_path):
    (tmp_path / "math500.jsonl").write_text(json.dumps({"text": "x", "label": "1"}))
    with pytest.raises(DataError, match="fields are \\['label', 'text'\\]"):
        prepare(["math500"], str(tmp_path / "out"), local_dir=str(tmp_path))
    with pytest.raises(DataError, match="unknown benchmark"):
        prepare(["nope"], str(tmp_path / "out"))


def test_offline_without_local_copy_says_where_to_put_files(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    cmd = [sys.executable, "-m", "openrlhf_dppo.data.prepare", "--out", str(tmp_path / "out")]
    cmd += ["--train", "", "--eval", "math500", "--local-dir", str(tmp_path / "mine")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "cannot load benchmark 'math500'" in proc.stderr
    assert f"Put a copy at {tmp_path / 'mine' / 'math500.jsonl'}" in proc.stderr
    assert "--local-dir" in proc.stderr and "Traceback" not in proc.stderr
