"""The countdown reward file: reasoning-gym's own scorer on the answer extracted from the completion,
in OpenRLHF's ``reward_func`` contract (loaded by path, as the host does)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

reasoning_gym = pytest.importorskip("reasoning_gym")
from openrlhf_dppo.tiny import countdown  # noqa: E402


@pytest.fixture(scope="module")
def reward(repo_root):
    spec = importlib.util.spec_from_file_location(
        "rf_countdown", repo_root / "openrlhf_dppo/rewards/countdown.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def items():
    """The generator's own problems and solutions (another seed than the build's)."""
    return list(reasoning_gym.create_dataset("countdown", size=60, seed=123, **countdown.GENERATOR))


def _label(item) -> str:
    meta = item["metadata"]
    return json.dumps({"numbers": meta["numbers"], "target": meta["target"]})


def _call(reward, answers_and_items):
    """reward_func on queries ``prompt + scratchpad;answer<eos>`` (the answer ``None``: truncated)."""
    queries, prompts, labels = [], [], []
    for answer, item in answers_and_items:
        prompt = countdown.row(item["metadata"]["numbers"], item["metadata"]["target"])["input"]
        tail = "<eos>" if answer is not None else ""
        queries.append(prompt + "1+2=3;" + ("(1+2)" if answer is None else answer) + tail + "<pad>")
        prompts.append(prompt)
        labels.append(_label(item))
    return reward.reward_func(queries, prompts, labels)


def test_the_reward_is_the_scorer_on_the_generators_own_solutions(reward, items):
    scorer = reasoning_gym.create_dataset("countdown", size=1, seed=0, **countdown.GENERATOR)
    out = _call(reward, [(item["answer"], item) for item in items])
    expected = [scorer.score_answer(item["answer"], item) for item in items]
    assert expected == [1.0] * len(items)
    assert torch.equal(out["rewards"], torch.tensor(expected))
    assert out["scores"].tolist() == out["extra_logs"]["accuracy"].tolist() == [1.0] * len(items)


def test_the_reward_is_the_scorer_on_wrong_answers(reward, items):
    """Wrong answers of every kind the scorer tells apart: another problem's solution (other numbers),
    the right numbers with the wrong value, too few numbers, not an expression, empty."""
    scorer = reasoning_gym.create_dataset("countdown", size=1, seed=0, **countdown.GENERATOR)
    cases = []
    for k, item in enumerate(items):
        nums = item["metadata"]["numbers"]
        other = items[(k + 1) % len(items)]["answer"]
        total = "+".join(map(str, nums))
        wrong_value = total if eval(total) != item["metadata"]["target"] else "*".join(map(str, nums))
        cases += [(other, item), (wrong_value, item), (str(nums[0]), item), ("(1+", item), ("", item)]
    out = _call(reward, cases)
    expected = [scorer.score_answer(answer, item) for answer, item in cases]
    assert torch.equal(out["rewards"], torch.tensor(expected))  # float32, as the host expects
    assert 0.05 in expected and 0.01 in expected  # partial credit: rewards outside {0, 1}
    assert out["scores"].tolist() == [float(x == 1.0) for x in expected]


def test_a_truncated_completion_scores_as_no_answer(reward, items):
    scorer = reasoning_gym.create_dataset("countdown", size=1, seed=0, **countdown.GENERATOR)
    out = _call(reward, [(None, items[0])])
    assert scorer.score_answer(None, items[0]) == 0.01
    assert torch.equal(out["rewards"], torch.tensor([0.01]))


def test_only_the_text_after_the_last_separator_is_the_answer(reward):
    label = json.dumps({"numbers": [4, 7, 3], "target": 25})
    assert reward.score("4*7=28,28-3=25;(4*7)-3<eos>", label) == 1.0
    assert reward.score("(4*7)-3<eos>", label) == 1.0  # no scratchpad: the whole text
    assert reward.score("4*7=28;28-3=25;(4*7)+3<eos>", label) == 0.05
    assert reward.score("4*7=28,28-3=25;(4*7)-3", label) == 0.01  # truncated before <eos>


@pytest.mark.parametrize("answer", ["9**9**9**9", "2**3", "__import__('os')", "x+1", "9" * 70])
def test_answers_outside_the_arithmetic_alphabet_never_reach_the_scorer(reward, answer, monkeypatch):
    """The scorer evaluates the text with sympy (an eval); a power tower would never return."""
    seen = []
    monkeypatch.setattr(reward.scorer(), "score_answer", lambda a, e: seen.append(a) or 0.01)
    assert reward.score(answer + "<eos>", json.dumps({"numbers": [2, 3], "target": 8})) == 0.01
    assert seen == [None]


def test_rewards_are_a_float_tensor_per_query(reward, items):
    out = _call(reward, [(items[0]["answer"], items[0]), ("1", items[1])])
    assert out["rewards"].dtype == torch.float32 and out["rewards"].shape == (2,)


@pytest.mark.parametrize(
    "label",
    [
        r"\frac{1}{2}",  # a MATH answer
        "",  # no --data.label_key: OpenRLHF passes ""
        "17",  # the arithmetic task's
        '{"numbers": [4, 7, 3]}',  # no target
        '{"numbers": [4, "7"], "target": 25}',
        "[4, 7, 3, 25]",
    ],
)
def test_a_label_that_is_not_a_countdown_problem_is_refused_naming_the_field_and_the_format(reward, label):
    with pytest.raises(ValueError) as err:
        reward.reward_func(["4+7=11;(4*7)-3<eos>"], [""], [label])
    message = str(err.value)
    assert type(err.value) is ValueError and repr(label) in message, message
    assert "--data.label_key" in message and '{"numbers": [...], "target": T}' in message, message
