"""Reward for the countdown task (``openrlhf_dppo.tiny.countdown``), in OpenRLHF's reward_func contract.

``--reward.remote_url openrlhf_dppo/rewards/countdown.py``. The score is reasoning-gym's
``CountdownDataset.score_answer`` (0.1.25) on the text after the completion's last ``;``: 1.0 right,
0.05 parses but wrong, 0.01 nothing to score (truncated, empty, not arithmetic, or characters other
than digits, ``+-*/()`` and spaces, or ``**``: sympy would never return). Returned: ``rewards`` = the
score; ``scores`` and ``extra_logs["accuracy"]`` = 1.0 for a solved problem else 0.0 (what dynamic
filtering sees). A label that is not a countdown problem raises a ValueError naming the field (``entry``).
"""

from __future__ import annotations

import json
import re

import torch

EOS = "<eos>"
ANSWER_SEP = ";"
MAX_ANSWER_CHARS = 64
_SAFE = re.compile(r"[0-9+\-*/() ]+")
_SCORER = None


def scorer():
    """reasoning-gym's countdown dataset object (its ``score_answer`` reads only the entry's metadata)."""
    global _SCORER
    if _SCORER is None:
        from reasoning_gym.games.countdown import CountdownConfig, CountdownDataset

        _SCORER = CountdownDataset(CountdownConfig(size=1, seed=0))
    return _SCORER


def completion_of(query: str, prompt: str) -> str:
    """The generated part of ``query`` (the prompt is its prefix; decoding is exact per character)."""
    return query[len(prompt) :] if query.startswith(prompt) else query


def extract_answer(completion: str) -> str | None:
    """The answer expression of a completion, or None when there is none to score (see module doc)."""
    if EOS not in completion:
        return None  # truncated: no answer was committed
    answer = completion.split(EOS, 1)[0].rsplit(ANSWER_SEP, 1)[-1].strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS or "**" in answer or not _SAFE.fullmatch(answer):
        return None
    return answer


LABEL_FORMAT = '{"numbers": [...], "target": T}'


def entry(label: str) -> dict:
    """The scorer's entry from a dataset label ``LABEL_FORMAT`` (whole numbers); any other label raises a
    ValueError that names the field and the format."""
    try:
        problem = json.loads(label) if isinstance(label, str) else None
    except ValueError:
        problem = None

    def whole(x) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if (
        not isinstance(problem, dict)
        or not isinstance(problem.get("numbers"), list)
        or not all(map(whole, problem["numbers"]))
        or not whole(problem.get("target"))
    ):
        shown = label if not isinstance(label, str) or len(label) <= 80 else label[:77] + "..."
        raise ValueError(
            f"countdown reward: the label {shown!r} is not a countdown problem. The label (the dataset "
            f"field that --data.label_key names) must be the JSON {LABEL_FORMAT} with whole numbers, as "
            "openrlhf_dppo.tiny.countdown writes it; for MATH-style answers use rewards/math_reward.py"
        )
    return {"metadata": problem}


def score(completion: str, label: str) -> float:
    """reasoning-gym's score of the completion's answer: 1.0, 0.05 or 0.01."""
    return float(scorer().score_answer(extract_answer(completion), entry(label)))


def reward_func(queries, prompts, labels):
    rewards = torch.tensor(
        [score(completion_of(q, p), label) for q, p, label in zip(queries, prompts, labels)],
        dtype=torch.float,
    )
    solved = (rewards == 1.0).float()
    return {"rewards": rewards, "scores": solved, "extra_logs": {"accuracy": solved.clone()}}
