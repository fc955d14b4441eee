"""report.predictability (``python benchmarks/prompt_predictability.py``) and the prompt log it reads (``openrlhf_dppo.prompt_log``), on
hand-made run directories: the uniform and oracle rows by hand, a task whose all-equal groups history can
foresee (AUC 1, more gradient kept than a uniform draw), the AUC against a brute-force count, and bad
input."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from openrlhf_dppo import prompt_log
from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import predictability as pp


def make_run(
    root: Path, name: str, steps: list[tuple[list[int], list[list[float]]]], q=None, extra=()
) -> str:
    """A run dir whose metrics.jsonl trains steps 1..n and whose prompts.jsonl logs them; ``extra``:
    more prompt-log lines appended as they are (a resume's repeats, a step never trained)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"kind": "train", "step": k}) + "\n" for k in range(1, len(steps) + 1))
    )
    lines = [
        {"step": k, "index": idx, "q": (q or [1.0] * len(idx)), "rewards": rw}
        for k, (idx, rw) in enumerate(steps, 1)
    ] + list(extra)
    (d / "prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(d)


def foreseeable(epochs: int = 4, n: int = 8, G: int = 4) -> list[tuple[list[int], list[list[float]]]]:
    """Prompts 0..n-1 each drawn once per step (an epoch a step): even prompts always solved (all equal),
    odd ones solved half the time (mixed): a prompt's history foresees its group exactly."""
    return [
        (list(range(n)), [[1.0] * G if i % 2 == 0 else [1.0, 0.0] * (G // 2) for i in range(n)])
        for _ in range(epochs)
    ]


def _main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = pp.main(argv)
    return result, out.getvalue()


def test_uniform_and_oracle_rows_by_hand(tmp_path):
    make_run(tmp_path, "g_s1", foreseeable(epochs=2))
    result, text = _main(["--arm", f"g={tmp_path}/g_s*", "--rates", "0.25,0.5"])
    (study,) = result["g"]
    assert study["meta"] == {"steps": 2, "seen": 0.5, "equal_share": 0.5}  # step 2's 8 prompts were seen
    uni = study["rows"]["uniform"]
    for r in (0.25, 0.5):
        assert uni[r]["kept"] == pytest.approx(1 - r) and uni[r]["effective"] == pytest.approx(1 - r)
        assert uni[r]["equal_rolled"] == pytest.approx(0.5)
    # the oracle at r = 0.5: 4 all-equal groups at q_min 0.1, the 4 others share 4 - 0.4 = 3.6 -> q 0.9
    ora = study["rows"]["oracle"][0.5]
    assert ora["kept"] == pytest.approx(0.9) and ora["effective"] == pytest.approx(0.9)
    assert ora["equal_rolled"] == pytest.approx(0.4 / 4.0)
    # at r = 0.25 the budget (6 of 8) covers the 4 gradient groups at q = 1; the rest 2 go to the others
    assert study["rows"]["oracle"][0.25]["kept"] == pytest.approx(1.0)
    assert study["rows"]["oracle"][0.25]["equal_rolled"] == pytest.approx(2.0 / 6.0)
    assert "| oracle |" in text and "r=0.5: effective" in text


def test_a_history_that_foresees_the_groups_scores_auc_1_and_keeps_more_gradient_than_uniform(tmp_path):
    make_run(tmp_path, "g_s1", foreseeable(epochs=4))
    result, _ = _main(
        ["--arm", f"g={tmp_path}/g_s*", "--rates", "0.5", "--history", "0:1", "--first-step", "2"]
    )
    rows = result["g"][0]["rows"]
    assert result["g"][0]["meta"]["seen"] == 1.0
    for policy in ("q ~ s", "q ~ sqrt(s)"):
        row = rows[f"history 0:1, {policy}"]
        assert row["auc"] == 1.0
        assert row[0.5]["kept"] > 0.5 and row[0.5]["effective"] > 0.5
        assert row[0.5]["equal_rolled"] < 0.5
    # calibrated on the outcomes, a score that separates the two kinds of prompt exactly is the oracle
    calibrated = rows["history 0:1, calibrated in-sample, q ~ sqrt(P)"][0.5]
    assert calibrated["kept"] == pytest.approx(rows["oracle"][0.5]["kept"]) == pytest.approx(0.9)
    # q ~ s leans harder on the score than q ~ sqrt(s): more gradient kept, fewer all-equal rolled out
    assert rows["history 0:1, q ~ s"][0.5]["kept"] > rows["history 0:1, q ~ sqrt(s)"][0.5]["kept"]
    # a history with no memory of which prompt is which cannot beat chance: shuffle the groups' outcomes
    rng = random.Random(0)
    steps = []
    for idx, rw in foreseeable(epochs=4):
        rw = rw[:]
        rng.shuffle(rw)
        steps.append((idx, rw))
    make_run(tmp_path, "h_s1", steps)
    result, _ = _main(
        ["--arm", f"h={tmp_path}/h_s*", "--rates", "0.5", "--history", "0:1", "--first-step", "2"]
    )
    assert result["h"][0]["rows"]["history 0:1, q ~ s"]["auc"] < 0.9


def test_auc_equals_the_brute_force_count_with_ties():
    rng = np.random.default_rng(1)
    pos, neg = rng.integers(0, 5, 40).astype(float), rng.integers(0, 5, 30).astype(float)
    brute = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg)) / (pos.size * neg.size)
    assert pp.auc(pos, neg) == pytest.approx(brute, abs=1e-12)
    assert np.isnan(pp.auc(pos, np.array([])))


def test_the_log_reader_keeps_the_last_line_of_each_trained_step(tmp_path):
    steps = foreseeable(epochs=2, n=2, G=2)
    redo = {"step": 2, "index": [1, 0], "q": [1.0, 1.0], "rewards": [[0.0, 0.0], [1.0, 1.0]]}
    untrained = {"step": 3, "index": [0], "q": [1.0], "rewards": [[1.0, 1.0]]}
    d = make_run(tmp_path, "r", steps, extra=[redo, untrained])
    rows = prompt_log.read(d)
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["index"] == [1, 0]
    log = Path(d) / "prompts.jsonl"
    text = log.read_text()
    log.write_text(text + '{"step": 3, "ind')  # killed while writing: the cut line is left out
    assert [r["step"] for r in prompt_log.read(d)] == [1, 2]
    log.write_text('{"step": 1, "ind\n' + text)  # a broken line before others is an error, named
    with pytest.raises(R.RunDirError, match="prompts.jsonl:1: not valid JSON"):
        prompt_log.read(d)


def test_bad_input_is_refused_with_what_is_wrong(tmp_path, capsys):
    make_run(tmp_path, "dppo_s1", foreseeable(epochs=2), q=[0.5] * 8)
    with pytest.raises(SystemExit):
        pp.main(["--arm", f"d={tmp_path}/dppo_s*"])
    assert "q < 1 (a DPPO run)" in capsys.readouterr().err
    (tmp_path / "nolog").mkdir()
    (tmp_path / "nolog" / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    with pytest.raises(SystemExit):
        pp.main(["--arm", f"n={tmp_path}/nolog"])
    assert "--dppo.prompt_log true" in capsys.readouterr().err
    make_run(tmp_path, "ok", foreseeable(epochs=2))
    for argv, says in [
        (["--rates", "0.95"], "--rates must lie in"),
        (["--rates", "a"], "--rates must be numbers"),
        (["--history", "0.5"], "--history must be DECAY:PRIOR"),
        (["--history", "1:1"], "decay must be in [0, 1)"),
        (["--first-step", "0"], "--first-step must be >= 1"),
        (["--first-step", "9"], "no step from --first-step 9 on"),
    ]:
        with pytest.raises(SystemExit):
            pp.main(["--arm", f"o={tmp_path}/ok", *argv])
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        pp.main(["--arm", f"x={tmp_path}/none_*"])
    assert "expected NAME=GLOB matching at least one run directory" in capsys.readouterr().err


def test_calibration_maps_each_score_decile_and_the_unseen_to_their_gradient_share():
    score = np.array([0.1, 0.1, 0.2, 0.2, np.inf, np.inf, np.inf])
    grad = np.array([False, False, True, False, True, True, False])
    p = pp.calibrate(score, grad, bins=2)
    assert p(np.array([0.1, 0.2, np.inf])).tolist() == pytest.approx([1e-3, 0.5, 2 / 3])
