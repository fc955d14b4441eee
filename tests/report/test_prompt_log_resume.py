"""prompts.jsonl across a kill and a resume (``openrlhf_dppo.prompt_log``): a line cut short by a kill
is cut off by the resumed run's first ``append``, so its lines read back and none is glued onto the
fragment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_dppo import prompt_log


def _run_dir(tmp_path: Path, trained: int) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    lines = (json.dumps({"kind": "train", "step": k}) + "\n" for k in range(1, trained + 1))
    (d / "metrics.jsonl").write_text("".join(lines))
    return d


def _step(k: int) -> tuple[int, list[int], list[float], list[list[float]]]:
    return k, [k, k + 10], [1.0, 0.5], [[1.0, 0.0], [0.0, 0.0]]


def test_a_resumed_run_appends_after_a_line_cut_short_by_a_kill(tmp_path):
    d = _run_dir(tmp_path, trained=3)
    prompt_log.append(d, *_step(1))
    log = d / prompt_log.PROMPT_LOG
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"step": 2, "index": [2, 1')  # killed while writing step 2
    prompt_log.append(d, *_step(2))  # the resumed run redoes step 2, then 3
    prompt_log.append(d, *_step(3))
    rows = prompt_log.read(d)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["index"] == [2, 12] and rows[1]["q"] == [1.0, 0.5]
    assert log.read_text().count("\n") == 3 and log.read_bytes().startswith(whole)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
def test_cut_partial_line_keeps_everything_up_to_the_last_newline(tmp_path, chunk):
    path = tmp_path / "f.jsonl"
    # a fragment longer than the chunk: the search for the newline crosses chunk boundaries
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n' + b"x" * 20)
    assert prompt_log.cut_partial_line(path, chunk=chunk) == 20
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert prompt_log.cut_partial_line(path, chunk=chunk) == 0  # a whole file is left as it is
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    path.write_bytes(b'{"step": 1, "ind')  # no newline at all: the one line is the fragment
    assert prompt_log.cut_partial_line(path, chunk=chunk) == 16 and path.read_bytes() == b""
    assert prompt_log.cut_partial_line(path, chunk=chunk) == 0  # empty
    assert prompt_log.cut_partial_line(tmp_path / "missing", chunk=chunk) == 0
