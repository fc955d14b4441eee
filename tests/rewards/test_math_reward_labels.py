"""The math reward on a dataset that is not a math dataset: its labels score nothing (``bad_label``),
whatever the response says; the reward never raises (see ``rewards/math_reward.py``)."""

from __future__ import annotations

import json

from openrlhf_dppo.rewards.math_reward import MathReward


def test_a_json_object_label_is_a_bad_label_not_an_expression_to_compare():
    # a countdown label: math-verify would read the object's numbers and call a boxed target correct
    label = json.dumps({"numbers": [3, 5, 7], "target": 22})
    out = MathReward()(["so the answer is \\boxed{22}"], [""], [label])
    assert out["rewards"].tolist() == [0.0] and out["extra_logs"]["math/reason_bad_label"].tolist() == [1.0]
    # a JSON-looking text that is no object stays an expression (a MATH interval or set)
    assert MathReward().judge(r"\boxed{[1, 2]}", "[1, 2]") == ("correct", True)
