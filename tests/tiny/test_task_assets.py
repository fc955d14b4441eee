"""The tiny task's pieces: deterministic disjoint splits, the local tokenizer, the build fingerprint and
the two tiny training scripts (moved here from tests/e2e/test_cpu_compat.py)."""

from __future__ import annotations

import re


def test_task_is_deterministic_and_splits_are_disjoint():
    from openrlhf_dppo.tiny import task

    a, b = task.problems(5, 200), task.problems(5, 200)
    assert a == b
    held = {r["input"] for r in task.problems(6, 100)}
    train = task.problems(7, 300, exclude=held)
    assert not held & {r["input"] for r in train}
    for r in train:
        x, y = r["input"][:-1].split("+")
        assert int(x) + int(y) == int(r["label"]) and 0 <= int(x) < 100


def test_tokenizer_round_trip():
    from openrlhf_dppo.tiny.tokenizer import EOS_ID, build_tokenizer

    tok = build_tokenizer()
    ids = tok("73+8=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    assert tok.decode(ids + [EOS_ID], skip_special_tokens=False) == "73+8=<eos>"


def test_demo_scripts_differ_only_in_algorithm_flags(repo_root):
    scripts = repo_root / "examples" / "scripts"

    def body(name):
        lines = (scripts / name).read_text().splitlines()
        return [ln for ln in lines if not re.match(r"^(# (GRPO|DPPO) on the embedded|NAME=|ALGO_FLAGS=)", ln)]

    assert body("train_grpo_tiny_cpu.sh") == body("train_dppo_tiny_cpu.sh")
    text = (scripts / "train_dppo_tiny_cpu.sh").read_text()
    assert "--dppo.prompt_prune_rate" in text and "--dppo.completion_prune_rate" in text


def test_build_fingerprint_tracks_inputs():
    from openrlhf_dppo.tiny import build

    assert build.fingerprint(0, build.WARM) == build.fingerprint(0, dict(build.WARM))
    assert build.fingerprint(0, build.WARM) != build.fingerprint(1, build.WARM)
    assert build.fingerprint(0, build.WARM) != build.fingerprint(0, dict(build.WARM, lr=1e-3))
