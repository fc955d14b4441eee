"""Reward functions in OpenRLHF 0.11.2's ``reward_func(queries, prompts, labels)`` contract.

Each module is a file that ``--reward.remote_url <file.py>`` can load by path:
- ``math_reward.py``: math answers checked with math-verify (the MATH recipe);
- ``arithmetic.py`` and ``countdown.py``: the two tiny CPU tasks (``openrlhf_dppo.tiny``).

``reward_path(name)`` gives the absolute path to pass to ``--reward.remote_url``.
"""

import os


def reward_path(name: str) -> str:
    """Absolute path of the reward file ``<name>.py`` in this folder (``"math_reward"``, ...)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no reward file {path}")
    return path
