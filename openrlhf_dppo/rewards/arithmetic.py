"""Reward for the embedded arithmetic task (``openrlhf_dppo.tiny``), in OpenRLHF's reward_func contract.

``--reward.remote_url openrlhf_dppo/rewards/arithmetic.py``: 1.0 when the completion is exactly the label
then ``<eos>``, else 0.0. A label that is not a sum in digits raises a ValueError that names the field.
"""

from __future__ import annotations

import re

import torch

EOS = "<eos>"


def completion_of(query: str, prompt: str) -> str:
    """The generated part of ``query`` (the prompt is its prefix; decoding is exact per character)."""
    return query[len(prompt) :] if query.startswith(prompt) else query.rsplit("=", 1)[-1]


def expected(label) -> str:
    """The answer a label asks for: the sum in digits (a number is taken as its digits); any other label
    (an empty one, another task's) raises a ValueError."""
    text = str(label).strip()
    if not re.fullmatch(r"-?[0-9]+", text):
        shown = label if not isinstance(label, str) or len(label) <= 80 else label[:77] + "..."
        raise ValueError(
            f"arithmetic reward: the label {shown!r} is not a sum in digits. The label (the dataset field "
            'that --data.label_key names) must be the answer in digits, as openrlhf_dppo.tiny writes it ("17" '
            'for the prompt "12+5=")'
        )
    return text


def score(completion: str, label) -> float:
    """1.0 iff the completion is ``label`` then ``<eos>`` (surrounding spaces ignored)."""
    want = expected(label)
    if EOS not in completion:
        return 0.0  # truncated: no answer was committed
    answer = completion.split(EOS, 1)[0].strip()
    return 1.0 if answer == want else 0.0


def reward_func(queries, prompts, labels):
    rewards = torch.tensor(
        [score(completion_of(q, p), label) for q, p, label in zip(queries, prompts, labels)],
        dtype=torch.float,
    )
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"accuracy": rewards.clone()}}
