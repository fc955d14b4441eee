"""report.unseen_score on hand-made prompt logs: the online fit never sees the step it scores (leakage),
a feature that decides the outcome is learned for prompts never seen, and the command's bad input."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from openrlhf_dppo.report import prompt_features as F
from openrlhf_dppo.report import unseen_score as U
from openrlhf_dppo.report.selection import Replay, Step, auc

G = 4


def first_epoch(steps: int = 12, n: int = 8, seed: int = 0, mixed=None) -> list[Step]:
    """Every prompt drawn once (indices 0 .. steps * n - 1 in order); a group is mixed by ``mixed(i)``
    (default: a fair coin), else all 0 or all 1 at random."""
    rng = random.Random(seed)
    out = []
    for s in range(steps):
        idx = np.arange(s * n, (s + 1) * n)
        rows = []
        for i in idx.tolist():
            carries = rng.random() < 0.5 if mixed is None else mixed(i)
            rows.append([1.0, 0.0] * (G // 2) if carries else [float(rng.random() < 0.5)] * G)
        out.append(Step(idx, np.asarray(rows)))
    return out


def test_a_score_never_sees_its_own_rollout():
    """Features that name each prompt alone (one-hot by dataset index) and outcomes that are pure noise:
    a prompt drawn once can only be told apart by a fit that saw its own group. The replay's scores of
    a step's prompts are then all the same (only the intercept, learned from earlier steps, moves); the
    control, a fit that learns the step before scoring it, memorises the groups (AUC near 1), so this
    check would catch such a leak."""
    steps = first_epoch(steps=20, n=8, seed=3)  # 160 first draws: the online calibration acts from step 17
    assert 160 > U.CALIBRATION_MIN
    onehot = np.eye(160)
    scored = U.replay(steps, onehot, Replay(decay=0.0))
    assert not scored.seen.any()
    for values in (scored.direct, scored.score):
        per_step = values.reshape(20, 8)
        assert np.ptp(per_step, axis=1).max() == pytest.approx(0.0, abs=1e-12)
        assert abs(auc(values[scored.grad], values[~scored.grad]) - 0.5) < 0.1
    # the control: the same fit, taught the step's groups before scoring them
    ridge, pred, grad = U.OnlineRidge(160, 2, 1.0), [], []
    for step in steps:
        y = np.stack([step.grad.astype(float), (step.rewards >= 0.5).mean(axis=1)], 1)
        ridge.update(onehot[step.index], y)
        pred.append(ridge.predict(onehot[step.index])[:, 0])
        grad.append(step.grad)
    p, g = np.concatenate(pred), np.concatenate(grad)
    assert auc(p[g], p[~g]) > 0.95


def test_a_feature_that_decides_the_outcome_is_learned_for_prompts_never_seen():
    # even prompts' groups are always mixed, odd ones' never: a dataset field says which
    steps = first_epoch(steps=15, n=8, mixed=lambda i: i % 2 == 0)
    rows = [{"level": "even" if i % 2 == 0 else "odd"} for i in range(120)]
    x = F.field_features(rows, "level")
    cfg = Replay(decay=0.5)
    scored = U.replay(steps, x, cfg)
    res = U.summary(scored)
    assert res["auc_unseen"] > 0.75 and res["auc_unseen_direct"] > 0.75  # step 1 knows nothing: ties
    # the sqrt rule with that prior chooses the mixed prompts far better than a uniform draw of its cost
    assert res["over_uniform_unseen"] > 0.1
    blind = U.summary(U.replay(steps, None, cfg))  # the history alone: every unseen prompt alike
    assert blind["over_uniform_unseen"] == pytest.approx(0.0, abs=1e-9)
    assert blind["auc_unseen"] == 0.5


def test_the_online_ridge_is_the_closed_form_of_what_it_was_given():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 5)), rng.normal(size=(30, 2))
    r = U.OnlineRidge(5, 2, lam=2.0)
    assert r.predict(x) is None
    r.update(x[:10], y[:10])
    r.update(x[10:], y[10:])
    a = np.hstack([x, np.ones((30, 1))])
    w = np.linalg.solve(a.T @ a + np.diag([2.0] * 5 + [1e-9]), a.T @ y)
    assert r.predict(x[:3]) == pytest.approx(a[:3] @ w)


def test_ngram_features_are_stable_and_of_unit_norm():
    f = F.ngram_features(["12+34=", "12+34=", "98+7="])
    assert f.shape == (3, F.NGRAM_DIM) and np.allclose(np.linalg.norm(f, axis=1), 1.0)
    assert np.array_equal(f[0], f[1]) and not np.array_equal(f[0], f[2])
    assert F.ngram_features([""]).sum() == 0.0


def test_the_prior_matches_the_predicted_mean_and_gradient_probability():
    from openrlhf_dppo.core.history import beta_moment

    m, mixed = np.array([0.5, 0.5, 0.2, 0.9]), np.array([0.3, 0.9, 0.5, 0.1])
    kappa = U.prior_strength(m, mixed, 8)
    assert beta_moment(kappa * m, kappa * (1 - m), 8) == pytest.approx(mixed, abs=1e-6)
    # more than a Beta of that mean can reach (1 - 0.9^8 - 0.1^8 = 0.57): the strongest prior in range
    assert U.prior_strength(np.array([0.9]), np.array([0.9]), 8)[0] == pytest.approx(U.KAPPA_RANGE[1])


def test_bad_input_names_the_flag(tmp_path, capsys):
    with pytest.raises(ValueError, match="field:level"):
        F.field_features([{"level": 1}, {"input": "x"}], "level")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"question": "1+1="}) + "\n")
    with pytest.raises(ValueError, match="--input-key 'input'"):
        U.read_rows(str(data), 1, "input")
    with pytest.raises(ValueError, match="the log draws dataset index 4"):
        U.read_rows(str(data), 5, "question")


def test_the_online_calibration_is_fitted_on_earlier_first_draws_only(monkeypatch):
    """Each call of the calibration at step t sees exactly the first draws of steps 1 .. t - 1."""
    steps = first_epoch(steps=20, n=8, seed=4)
    sizes = []
    real = U.calibrate

    def spy(score, grad, *args):
        sizes.append(score.size)
        return real(score, grad, *args)

    monkeypatch.setattr(U, "calibrate", spy)
    U.replay(steps, np.eye(160), Replay(decay=0.0))
    first = (U.CALIBRATION_MIN + 7) // 8 + 1  # the first step with CALIBRATION_MIN earlier first draws
    assert sizes == [8 * (t - 1) for t in range(first, 21)]
