"""prompts.jsonl: each trained step's rolled-out groups, written under ``--dppo.prompt_log true``.

One line per step, ``{"step", "index": [...], "q": [...], "rewards": [[G rewards], ...]}``: the step's
rolled-out groups in order (dynamic filtering's dropped ones too), each with its prompt's dataset index,
the probability q it was rolled out with (1 where DPPO did not draw it: GRPO, dynamic filtering's
replacements) and its RAW rewards (before any length penalty); optionally ``"lengths": [[G completion
lengths in tokens], ...]`` (read where present: ``openrlhf-dppo advise`` charges screening's second round
from them). ``openrlhf-dppo advise`` and
``report.predictability`` replay GRPO runs' logs through the prompt history.

A resumed run appends the steps it redoes again (the file is not cut back to the checkpoint as
metrics.jsonl is): ``read`` takes the last line of each step, and only the steps metrics.jsonl has
trained. A line cut short by a kill is cut off by the next ``append`` (``cut_partial_line``), so the
resumed run's first line starts on a line of its own instead of being glued onto the fragment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from openrlhf_dppo.run_dir import STEP, TRAIN, RunDirError, last_per_step, read_metrics

PROMPT_LOG = "prompts.jsonl"
FIELDS = (STEP, "index", "q", "rewards")
LENGTHS = "lengths"  # optional: each group's completion lengths in tokens


def append(
    run_dir: str | os.PathLike,
    step: int,
    index: list[int],
    q: list[float],
    rewards: list[list[float]],
    lengths: list[list[int]] | None = None,
) -> None:
    """Append one step's rolled-out groups to ``run_dir``/prompts.jsonl (``lengths``: each group's
    completion lengths in tokens, like ``rewards``; optional)."""
    if not len(index) == len(q) == len(rewards):
        raise ValueError(f"{len(index)} indices, {len(q)} keep probabilities and {len(rewards)} groups")
    line: dict = {STEP: int(step), "index": [int(i) for i in index], "q": [float(x) for x in q],
                  "rewards": [[float(r) for r in g] for g in rewards]}  # fmt: skip
    if lengths is not None:
        if [len(g) for g in lengths] != [len(g) for g in rewards]:
            raise ValueError("lengths must have one length per reward, group by group")
        line[LENGTHS] = [[int(n) for n in g] for g in lengths]
    path = Path(run_dir) / PROMPT_LOG
    cut_partial_line(path)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def cut_partial_line(path: str | os.PathLike, chunk: int = 1 << 16) -> int:
    """Cut ``path`` back to its last newline; returns the number of bytes cut (0: the file is missing,
    empty or ends with a newline). Only a write that never finished leaves a file without a final
    newline, and the line it left is an incomplete record of a step the resumed run redoes: dropped, not
    ended with a newline (a broken line before others would make ``read`` raise)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    with open(path, "rb+") as fh:
        end = fh.seek(-1, os.SEEK_END) + 1
        if fh.read(1) == b"\n":
            return 0
        pos = end
        while pos > 0:  # back from the end, ``chunk`` bytes at a time, to just after the last newline
            start = max(pos - chunk, 0)
            fh.seek(start)
            newline = fh.read(pos - start).rfind(b"\n")
            if newline >= 0:
                pos = start + newline + 1
                break
            pos = start
        fh.truncate(pos)
    return end - pos


def read(run_dir: str | os.PathLike) -> list[dict]:
    """The run's log, one line per trained step in step order (see the module docstring). A last line cut
    short (a run killed while writing it) is left out; a missing file, or any other line that is not a
    JSON object with the four fields, raises RunDirError naming it."""
    path = Path(run_dir) / PROMPT_LOG
    if not path.is_file():
        raise RunDirError(f"{path}: not found (the run was not made with --dppo.prompt_log true)")
    trained = {r[STEP] for r in last_per_step(read_metrics(run_dir), TRAIN)}
    lines = [
        (n, text) for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if text.strip()
    ]
    by_step: dict[int, dict] = {}
    for n, text in lines:
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            if n == lines[-1][0]:
                break
            raise RunDirError(f"{path}:{n}: not valid JSON ({err})") from err
        if not isinstance(row, dict) or any(k not in row for k in FIELDS):
            raise RunDirError(f"{path}:{n}: expected an object with step, index, q and rewards")
        by_step[row[STEP]] = row
    return [by_step[s] for s in sorted(by_step) if s in trained]
