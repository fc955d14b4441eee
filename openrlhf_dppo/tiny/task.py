"""The embedded verifiable task: addition of two integers below 10**digits (default: two-digit).

A prompt is ``"<a>+<b>="`` and the answer is the decimal sum, e.g. ``"47+85="`` -> ``"132"``. The problem
space is every ordered pair ``0 <= a, b < 10**digits`` (10,000 problems for two digits). It is shuffled
once with the build seed and cut into disjoint splits, so no prompt is in two of them by construction:

  eval   held-out prompts, never trained on (neither in the RL pool nor in the warm-start data);
  dev    a reading of the warm start (never trained on, so ``eval`` is never looked at);
  train  the RL training pool;
  warm   everything else: the supervised warm-start data.

Difficulty spreads widely (a no-carry sum such as ``"3+4="`` is solved by the warm start, a double carry
into a third digit such as ``"97+58="`` mostly is not), which is the spread that history-guided prompt
pruning exploits. Pure Python, deterministic for a seed.
"""

from __future__ import annotations

import json
import random

SPLITS = ("eval", "dev", "train", "warm")


def problem(a: int, b: int) -> dict:
    """One problem as a dataset row: ``{"input": "a+b=", "label": "a+b as digits"}``."""
    return {"input": f"{a}+{b}=", "label": str(a + b)}


def split(seed: int, n_eval: int, n_dev: int, n_train: int, digits: int = 2) -> dict[str, list[dict]]:
    """The four disjoint splits of the problem space (see the module docstring), as lists of rows.

    ``warm`` gets every problem not in the first three. Raises ``ValueError`` when the space is too small.
    """
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
