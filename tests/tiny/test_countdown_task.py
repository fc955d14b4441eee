"""The second embedded task (countdown from reasoning-gym): scratchpads, disjoint splits, its own
vocabulary, and a reproducible build."""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("reasoning_gym")
from openrlhf_dppo.tiny import build, countdown, task, tokenizer  # noqa: E402

SMALL = dict(n_eval=20, n_dev=10, n_train=40, n_draws=300)


def _key(row) -> tuple:
    """A problem: the multiset of its numbers and its target (the order in the prompt does not count)."""
    meta = json.loads(row["label"])
    return tuple(sorted(meta["numbers"])), meta["target"]


@pytest.fixture(scope="module")
def splits():
    """The build's splits at the real sizes (about 25 s: 30,000 draws of the generator)."""
    return countdown.split(0)


def test_the_held_out_set_is_500_problems_in_no_other_split_in_any_order(splits):
    assert {name: len(rows) for name, rows in splits.items()}["eval"] == 500
    assert len(splits["train"]) == 2000 and len(splits["dev"]) == 200 and len(splits["warm"]) > 5000
    keys = {name: [_key(r) for r in rows] for name, rows in splits.items()}
    every = [k for ks in keys.values() for k in ks]
    assert len(every) == len(set(every))
    for name in ("dev", "train", "warm"):
        assert not set(keys["eval"]) & set(keys[name]), f"a held-out problem is in {name}"


def test_every_scratchpad_is_right_step_by_step_and_fits_the_generation_budget(splits):
    from openrlhf_dppo.rewards import countdown as reward

    rows = [r for rows in splits.values() for r in rows]
    for r in rows[::7]:
        steps, answer = r["solution"].split(";")
        for step in steps.split(","):
            a, op, b, c = re.fullmatch(r"(-?\d+)([-+*/])(\d+)=(-?\d+)", step).groups()
            assert eval(f"{a}{op}{b}") == int(c), r
        assert reward.score(r["solution"] + "<eos>", r["label"]) == 1.0, r
    longest = max(len(r["solution"]) for r in rows) + 1  # + <eos>, one token per character
    assert longest <= countdown.MAX_NEW_TOKENS
    assert max(len(r["input"]) for r in rows) + countdown.MAX_NEW_TOKENS <= countdown.MAX_LEN
    assert {len(json.loads(r["label"])["numbers"]) for r in splits["eval"]} == {3, 4}


def test_solve_prefers_non_negative_steps_and_reports_no_solution():
    assert countdown.solve([4, 7, 3], 25) == ([(4, "*", 7, 28), (28, "-", 3, 25)], "(4*7)-3")
    steps, expr = countdown.solve([2, 9, 3], 21)  # 2-9=-7, -7*-3 is not a left fold; 9*2+3 is
    assert all(s[3] >= 0 for s in steps) and eval(expr) == 21
    assert countdown.solve([1, 1, 1], 99) is None
    with pytest.raises(ValueError, match="no left-fold solution"):
        countdown.row([1, 1, 1], 99)


def test_split_is_deterministic_for_a_seed_and_refuses_too_many_prompts():
    assert countdown.split(5, **SMALL) == countdown.split(5, **SMALL)
    assert countdown.split(5, **SMALL)["eval"] != countdown.split(6, **SMALL)["eval"]
    with pytest.raises(ValueError, match="leaves no warm-start data"):
        countdown.split(5, n_eval=200, n_dev=50, n_train=50, n_draws=300)


def test_the_vocabulary_extends_the_first_tasks_without_moving_its_ids():
    assert countdown.VOCAB[: len(tokenizer.VOCAB)] == tokenizer.VOCAB
    assert len(set(countdown.VOCAB)) == len(countdown.VOCAB)
    first, second = tokenizer.build_tokenizer(), tokenizer.build_tokenizer(countdown.VOCAB)
    assert first("73+8=")["input_ids"] == second("73+8=")["input_ids"]
    text = "4,7,3>25:4*7=28,28-3=25;(4*7)-3"
    ids = second(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.PAD_ID not in ids  # every character known (<pad> is unk)
    assert second.decode(ids + [tokenizer.EOS_ID], skip_special_tokens=False) == text + "<eos>"
    assert build.model_config()["vocab_size"] == len(tokenizer.VOCAB) == 16  # the first task's model
    assert countdown.model_config()["vocab_size"] == len(countdown.VOCAB)


def test_two_small_builds_give_identical_weights_and_readings(tmp_path):
    """A 20-step warm start of a small model on small splits (seconds); the rule is the real one."""
    from safetensors.torch import load_file

    warm = dict(countdown.WARM, steps=20, log_every=10)
    infos, weights = [], []
    for name in ("a", "b"):
        out = str(tmp_path / name)
        infos.append(countdown.build_countdown(out, 0, warm, "64x1x128", SMALL, log=lambda *_: None))
        weights.append(load_file(os.path.join(build.paths(out)["model"], "model.safetensors")))
        rows = {n: task.read_jsonl(build.paths(out)[n]) for n in task.SPLITS}
        assert {n: len(r) for n, r in rows.items()} == infos[-1]["splits"]
    a, b = weights
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        assert a[key].equal(b[key]), key
    infos[0].pop("build_seconds"), infos[1].pop("build_seconds")
    assert infos[0] == infos[1]
    assert infos[0]["warm_start"]["steps"] == 20 and infos[0]["warm_start"]["dtype"] == "float64"
    assert (
        0.0 <= infos[0]["warm_start"]["eval_greedy_acc"] <= infos[0]["warm_start"]["eval_greedy_score"] <= 1
    )


def test_the_build_is_cached_by_fingerprint(tmp_path, monkeypatch):
    out = str(tmp_path / "c")
    warm = dict(steps=2)
    first = countdown.build_countdown(
        out, 0, dict(countdown.WARM, **warm), "64x1x128", SMALL, log=lambda *_: None
    )
    monkeypatch.setattr(countdown, "build_countdown", lambda *a, **k: pytest.fail("rebuilt a current build"))
    assert countdown.ensure_built(out, 0, size="64x1x128", warm=warm, counts=SMALL) == first
    base = countdown.fingerprint(0, countdown.WARM)
    assert base != countdown.fingerprint(1, countdown.WARM)
    assert base != countdown.fingerprint(0, dict(countdown.WARM, steps=1))
    assert base != countdown.fingerprint(0, countdown.WARM, "xs")
    assert base != countdown.fingerprint(0, countdown.WARM, counts=SMALL)
