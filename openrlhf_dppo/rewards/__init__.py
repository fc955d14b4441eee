"""Reward files for ``--reward.remote_url <file.py>`` (OpenRLHF 0.11.2's ``reward_func(queries, prompts,
labels)``): ``math_reward.py`` (math-verify), ``arithmetic.py`` and ``countdown.py`` (the tiny tasks).
"""

import os


def reward_path(name: str) -> str:
    """Absolute path of the reward file ``<name>.py`` in this folder (``"math_reward"``, ...)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no reward file {path}")
    return path
