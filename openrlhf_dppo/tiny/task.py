"""The embedded verifiable task: addition of two integers below 10**digits (``"47+85="`` -> ``"132"``).

Every ordered pair is shuffled once with the seed and cut into the disjoint ``SPLITS``: ``eval`` (held
out), ``dev`` (a reading of the warm start), ``train`` (the RL pool), ``warm`` (the warm-start data).
"""

from __future__ import annotations

import json
import random

SPLITS = ("eval", "dev", "train", "warm")


def problem(a: int, b: int) -> dict:
    """One problem as a dataset row: ``{"input": "a+b=", "label": "a+b as digits"}``."""
    return {"input": f"{a}+{b}=", "label": str(a + b)}


def split(seed: int, n_eval: int, n_dev: int, n_train: int, digits: int = 2) -> dict[str, list[dict]]:
    """The four disjoint splits, as lists of rows; ``warm`` gets the rest. ValueError when too few."""
    size = 10**digits
    if n_eval + n_dev + n_train > size * size:
        raise ValueError(
            f"n_eval + n_dev + n_train = {n_eval + n_dev + n_train} exceeds the {size * size} problems"
            f" of {digits}-digit addition"
        )
    order = list(range(size * size))
    random.Random(seed).shuffle(order)
    rows = [problem(i // size, i % size) for i in order]
    cuts = [0, n_eval, n_eval + n_dev, n_eval + n_dev + n_train, len(rows)]
    return {name: rows[cuts[k] : cuts[k + 1]] for k, name in enumerate(SPLITS)}


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
