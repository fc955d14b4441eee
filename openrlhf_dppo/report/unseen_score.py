"""Scores for prompts never seen, replayed on a GRPO run's prompt log (a study: no flag runs them).

    python -m openrlhf_dppo.report.unseen_score RUN_DIR --data TRAIN.jsonl [--input-key input]
        [--features ngrams,hidden,field:level] [--model MODEL_DIR] [--out DIR]

A history scores a prompt only after its first rollout (METHOD.md, "Prompts never seen"). Each candidate
here scores a prompt from what is known before it is ever rolled out, with a model learned online from
every group rolled out so far, and enters as the PRIOR of the prompt's Beta posterior, so that the prompt's
own history takes over as it accumulates:

- features of the prompt (``report.prompt_features``): ``ngrams``, hashed character 1- to 4-grams of its
  text (signed hashing into ``NGRAM_DIM`` buckets, rows scaled to unit norm); ``hidden``, the policy's own
  representation: the last hidden state of the prompt's last token in one prompt-only forward of the
  model at ``--model`` (transformers, CPU). In this replay the features come from that one model, the
  STARTING policy, frozen, not the policy of each step (a training-time probe would refit on the current
  policy's states); ``field:NAME``, the one-hot of a dataset field the user names (MATH's ``level``);
- a ridge fit (``OnlineRidge``: the normal equations accumulated group by group, solved before each
  step) of two targets: whether the group carries gradient (its G rewards are not all equal) and its mean
  success (a reward >= 0.5 is a success);
- the calibration of the predicted gradient probability (``CALIBRATION``): ``online`` (the default)
  maps it to the share of gradient-carrying groups among the EARLIER first draws whose out-of-sample
  prediction fell in the same decile (``report.predictability.calibrate`` fitted on the past only, once
  ``CALIBRATION_MIN`` of them exist; the ridge's own before): a weak score's spread is variance the sqrt
  rule pays for, so it must be as wide as the score's power and no wider; ``none``: the ridge's own;
  ``in-sample``, a bound: fitted on the very groups it then scores (no draw can);
- the prior: Beta(kappa m, kappa (1 - m)) with m the predicted mean success (clipped to [0.02, 0.98])
  and kappa such that its P(G samples not all equal) is the predicted gradient probability (clipped to
  [0.01, 0.99]; ``prior_strength``): a mean alone cannot tell a prompt solved half the time from one
  solved always or never. Before any group is learned, the history's own Beta(prior, prior). The prior
  is fixed at the prompt's first draw and kept; the posterior adds the history's discounted successes
  and count (``core.PromptHistory`` at the run's settings), and its E[v] (``core.history.beta_moment``,
  group_norm: at the first draw, the predicted gradient probability) is the sqrt rule's signal, its
  costs the history's (the logged completion lengths).

Leakage: at each step every drawn prompt is scored from the fit of the EARLIER steps' groups, and only
then are the step's groups added (``replay``); a prompt's score never sees its own current rollout
(tests/report/test_unseen_score.py checks that a fit which did would be caught).

Per candidate, at the recommended mode's cost (zero-share's rate, fed the log's all-equal shares) and the
sqrt rule (``core.prompt_policy_keep_probs``): the AUC of "the group carries gradient" on unseen prompts
(the prior's E[v]; ``direct``: the ridge's own gradient prediction) and on seen ones (the posterior's),
and as in ``report.selection`` the kept and effective share of the gradient-carrying groups and the
effective share over a uniform draw at equal cost, on unseen and on seen prompts. Rows also: the uniform
policy, the sqrt rule on the history alone (unseen prompts scored as the mean, as ``--dppo.unseen_prompts
mean``), and the oracle.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from openrlhf_dppo.core.history import PromptHistory, PromptSignals, beta_moment
from openrlhf_dppo.core.keep_probs import prompt_keep_probs, prompt_policy_keep_probs
from openrlhf_dppo.core.rate_control import PromptRateControl
from openrlhf_dppo.report.predictability import calibrate
from openrlhf_dppo.report.prompt_features import field_features, hidden_features, ngram_features
from openrlhf_dppo.report.selection import Replay, Step, Tally, auc, read_steps

KAPPA_RANGE = (1e-2, 1e3)
M_CLIP = (0.02, 0.98)
MIXED_CLIP = (0.01, 0.99)
CALIBRATION = ("online", "none", "in-sample")
CALIBRATION_MIN = 128  # earlier first draws before the online calibration is used


# -- the online fit ------------------------------------------------------------------------------------
class OnlineRidge:
    """Ridge regression of k targets on d features plus an unpenalised intercept, refit from the
    accumulated normal equations: ``predict`` uses only what ``update`` was given before it."""

    def __init__(self, dim: int, targets: int, lam: float = 1.0) -> None:
        self.xtx = np.zeros((dim + 1, dim + 1))
        self.xty = np.zeros((dim + 1, targets))
        self.reg = np.diag(np.r_[np.full(dim, float(lam)), 1e-9])
        self.n = 0
        self._w: np.ndarray | None = None

    @staticmethod
    def _aug(x: np.ndarray) -> np.ndarray:
        return np.hstack([x, np.ones((x.shape[0], 1))])

    def update(self, x: np.ndarray, y: np.ndarray) -> None:
        a = self._aug(x)
        self.xtx += a.T @ a
        self.xty += a.T @ y
        self.n += x.shape[0]
        self._w = None

    def predict(self, x: np.ndarray) -> np.ndarray | None:
        """(N, k) predictions, or None before any update."""
        if self.n == 0:
            return None
        if self._w is None:
            self._w = np.linalg.solve(self.xtx + self.reg, self.xty)
        return self._aug(x) @ self._w


def prior_strength(m: np.ndarray, mixed: np.ndarray, G: int) -> np.ndarray:
    """kappa such that Beta(kappa m, kappa (1 - m)) gives P(G samples not all equal) = ``mixed``
    (``beta_moment`` grows with kappa, from 0 to 1 - m^G - (1 - m)^G): bisection in log kappa within
    ``KAPPA_RANGE``, its ends where ``mixed`` lies outside what the range reaches."""
    lo = np.full(m.shape, np.log(KAPPA_RANGE[0]))
    hi = np.full(m.shape, np.log(KAPPA_RANGE[1]))
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        k = np.exp(mid)
        below = beta_moment(k * m, k * (1.0 - m), G) < mixed
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.exp(0.5 * (lo + hi))


@dataclass
class Scored:
    """One candidate's replay: per group (in log order) the prior's E[v] for unseen prompts, the posterior's
    for seen ones, the ridge's direct gradient prediction, whether the prompt was seen, and the rule tallies."""

    score: np.ndarray
    direct: np.ndarray
    seen: np.ndarray
    grad: np.ndarray
    tally: Tally


def _signals(moment: np.ndarray, cost: np.ndarray, unseen: np.ndarray) -> PromptSignals:
    m = torch.from_numpy(np.maximum(moment, 0.0))
    return PromptSignals(
        m,
        m.clone(),
        torch.from_numpy(cost),
        torch.from_numpy(unseen),
        torch.zeros_like(torch.from_numpy(unseen)),
    )


def _gen(q: np.ndarray, step: Step) -> float:
    tok = step.tokens().sum(axis=1)
    return float((q * tok).sum() / tok.sum())


def replay(
    steps: list[Step],
    features: np.ndarray | None,
    cfg: Replay,
    lam: float = 1.0,
    calibration: str = "online",
    in_sample: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Scored:
    """One candidate (``features``: (N, d) rows by dataset index; None: the history alone, unseen prompts
    scored as the mean) replayed as the module docstring says: at each step score, draw at zero-share's
    rate with the sqrt rule, then learn the step's groups. calibration (of the predicted gradient
    probability): "online" (``CALIBRATION``), "none" (the ridge's own, clipped), "in-sample"
    (``in_sample``: a map fitted on the very groups it scores, a bound no draw reaches)."""
    G = steps[0].rewards.shape[1]
    hist = PromptHistory(decay=cfg.decay, prior=cfg.prior, reward_kind="binary")
    control = PromptRateControl("zero-share", cfg.zero_share_initial, cfg.zero_share_cap)
    ridge = None if features is None else OnlineRidge(features.shape[1], 2, lam)
    prior: dict[int, tuple[float, float]] = {}  # (a, b) of each prompt, fixed at its first draw
    past_pred: list[float] = []
    past_grad: list[bool] = []
    tally = Tally()
    scores, directs, seens, grads = [], [], [], []
    for number, step in enumerate(steps, 1):
        idx = torch.from_numpy(step.index)
        success = (step.rewards >= 0.5).astype(np.float64)
        seen = np.isfinite(hist.score(idx, G).numpy())
        cost = hist.cost(idx).numpy()
        direct = np.full(step.index.size, np.nan)
        if ridge is None or features is None:
            sig = hist.signals(idx, G, cfg.estimator, "mean")
            moment = sig.moment.numpy()
        else:
            pred = ridge.predict(features[step.index])
            if pred is None:  # nothing learned yet: the history's own prior Beta(prior, prior)
                m_new, kappa = np.full(step.index.size, 0.5), np.full(step.index.size, 2.0 * cfg.prior)
                direct = beta_moment(kappa * m_new, kappa * (1 - m_new), G)
            else:
                m_new, direct = np.clip(pred[:, 1], *M_CLIP), pred[:, 0]
                mixed = direct
                if calibration == "in-sample" and in_sample is not None:
                    mixed = in_sample(direct)
                elif calibration == "online" and len(past_pred) >= CALIBRATION_MIN:
                    mixed = calibrate(np.asarray(past_pred), np.asarray(past_grad))(direct)
                kappa = prior_strength(m_new, np.clip(mixed, *MIXED_CLIP), G)
            for j, i in enumerate(step.index.tolist()):
                if not seen[j]:
                    prior.setdefault(i, (float(kappa[j] * m_new[j]), float(kappa[j] * (1.0 - m_new[j]))))
            a0 = np.array([prior[i][0] for i in step.index.tolist()])
            b0 = np.array([prior[i][1] for i in step.index.tolist()])
            inside = step.index < hist.capacity
            succ, n = np.zeros(step.index.size), np.zeros(step.index.size)
            succ[inside], n[inside] = hist.succ[step.index[inside]], hist.n[step.index[inside]]
            moment = beta_moment(a0 + succ, b0 + np.maximum(n - succ, 0.0), G)
            sig = _signals(moment, cost, ~seen)
        rate = control.rate()
        q = prompt_policy_keep_probs(sig, 1.0 - rate, "sqrt", cfg.q_min)[0].numpy()
        tally.add(q, step.grad, _gen(q, step), 0.0, rate, seen)
        scores.append(moment)
        directs.append(direct)
        seens.append(seen)
        grads.append(step.grad)
        # only now the step's groups: the fit and the history learn them
        if ridge is not None and features is not None:
            y = np.stack([step.grad.astype(np.float64), success.mean(axis=1)], 1)
            ridge.update(features[step.index], y)
            past_pred += direct[
                ~seen
            ].tolist()  # out-of-sample predictions of first draws, then their outcome
            past_grad += step.grad[~seen].tolist()
        lengths = None if step.lengths is None else torch.from_numpy(step.lengths)
        hist.update(idx, torch.from_numpy(success), number, tokens=lengths)
        control.observe(float(1.0 - step.grad.mean()))
    cat = np.concatenate
    return Scored(cat(scores), cat(directs), cat(seens), cat(grads), tally)


def baselines(steps: list[Step], cfg: Replay) -> dict[str, Tally]:
    """The uniform policy and the oracle at zero-share's rate (history costs for neither)."""
    G = steps[0].rewards.shape[1]
    control = PromptRateControl("zero-share", cfg.zero_share_initial, cfg.zero_share_cap)
    hist = PromptHistory(decay=cfg.decay, prior=cfg.prior)
    out = {"uniform": Tally(), "oracle": Tally()}
    for number, step in enumerate(steps, 1):
        idx = torch.from_numpy(step.index)
        seen = np.isfinite(hist.score(idx, G).numpy())
        rate = control.rate()
        uni = np.full(step.index.size, 1.0 - rate)
        orc, _ = prompt_keep_probs(torch.from_numpy(step.grad.astype(np.float64)), 1.0 - rate, cfg.q_min)
        for name, q in (("uniform", uni), ("oracle", orc.numpy())):
            out[name].add(q, step.grad, _gen(q, step), 0.0, rate, seen)
        hist.update(idx, torch.from_numpy(step.rewards), number)
        control.observe(float(1.0 - step.grad.mean()))
    return out


def summary(s: Scored | Tally) -> dict[str, float]:
    t = s.tally if isinstance(s, Scored) else s
    r = t.result()
    out = {k: r[k] for k in ("rate", "gen")}
    for sub in ("unseen", "seen"):
        out[f"grad_{sub}"] = r[f"grad_{sub}"]
        out[f"kept_{sub}"] = r[f"kept_{sub}"]
        out[f"effective_{sub}"] = r[f"effective_{sub}"]
        out[f"over_uniform_{sub}"] = r[f"effective_{sub}"] - r[f"uniform_{sub}"]
    if isinstance(s, Scored):
        un, se = ~s.seen, s.seen
        out["auc_unseen"] = auc(s.score[un & s.grad], s.score[un & ~s.grad])
        d = s.direct
        out["auc_unseen_direct"] = (
            auc(d[un & s.grad], d[un & ~s.grad]) if np.isfinite(d).any() else float("nan")
        )
        out["auc_seen"] = auc(s.score[se & s.grad], s.score[se & ~s.grad])
    return out


# -- the command -----------------------------------------------------------------------------------------
def read_rows(path: str, n: int, input_key: str) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if len(rows) < n:
        raise ValueError(f"--data {path}: {len(rows)} rows, but the log draws dataset index {n - 1}")
    if rows and input_key not in rows[0]:
        raise ValueError(f"--input-key {input_key!r}: not a field of {path} (fields: {', '.join(rows[0])})")
    return rows


COLUMNS = (("auc_unseen", "AUC unseen"), ("auc_unseen_direct", "AUC unseen (direct)"), ("auc_seen", "AUC seen"),
           ("kept_unseen", "kept unseen"), ("effective_unseen", "eff unseen"),
           ("over_uniform_unseen", "eff unseen - uniform"), ("kept_seen", "kept seen"),
           ("effective_seen", "eff seen"), ("over_uniform_seen", "eff seen - uniform"))  # fmt: skip


def table(rows: dict[str, dict[str, float]]) -> str:
    head = ["score (sqrt rule at zero-share's rate)"] + [c for _, c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        cells = []
        for key, _ in COLUMNS:
            v = r.get(key, float("nan"))
            cells.append("—" if v != v else (f"{v:+.3f}" if key.startswith("over") else f"{v:.3f}"))
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m openrlhf_dppo.report.unseen_score", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("run", help="a GRPO run directory made with --dppo.prompt_log true")
    ap.add_argument("--data", required=True, help="the run's prompt data (jsonl): row i is dataset index i")
    ap.add_argument("--input-key", default="input", help="the prompt text's field (default: input)")
    ap.add_argument("--features", default="ngrams", help="comma-separated: ngrams, hidden, field:NAME")
    ap.add_argument("--model", default=None, help="the model for hidden (a transformers directory)")
    ap.add_argument("--lam", type=float, default=1.0, help="the ridge penalty (default 1)")
    ap.add_argument("--out", default=None, help="write unseen_score.json and unseen_score.md here")
    args = ap.parse_args(argv)
    try:
        steps, grpo = read_steps(args.run)
        if not steps or not grpo:
            raise ValueError(f"{args.run}: needs a GRPO prompt log (every drawn prompt's group, q = 1)")
        n = int(max(s.index.max() for s in steps)) + 1
        rows = read_rows(args.data, n, args.input_key)
        texts = [str(r[args.input_key]) for r in rows]
        feats, costs = {}, {}
        for name in [f.strip() for f in args.features.split(",") if f.strip()]:
            if name == "ngrams":
                feats["text n-grams (ridge)"] = ngram_features(texts)
            elif name == "hidden":
                if not args.model:
                    raise ValueError("--features hidden needs --model (the starting policy's directory)")
                feats["last hidden state of the starting model (ridge)"], costs["hidden"] = hidden_features(
                    texts, args.model
                )
            elif name.startswith("field:"):
                feats[f"dataset field {name[6:]} (ridge)"] = field_features(rows, name[6:])
            else:
                raise ValueError(f"--features: unknown {name!r} (ngrams, hidden, field:NAME)")
    except (OSError, ValueError) as err:
        ap.error(str(err))
    from openrlhf_dppo.report.advise import run_config
    from openrlhf_dppo.report.run import load_run

    cfg = run_config(load_run(args.run), (0.5,), ())
    base = baselines(steps, cfg)
    out = {"uniform draw (the control)": summary(base["uniform"]),
           "history alone, unseen as the mean": summary(replay(steps, None, cfg))}  # fmt: skip
    for name, x in feats.items():
        online = replay(steps, x[:n], cfg, args.lam)
        out[f"prior from {name}"] = summary(online)
        out[f"prior from {name}, uncalibrated"] = summary(replay(steps, x[:n], cfg, args.lam, "none"))
        un = ~online.seen
        bound = calibrate(online.direct[un], online.grad[un])
        out[f"prior from {name}, calibrated in-sample (a bound)"] = summary(
            replay(steps, x[:n], cfg, args.lam, "in-sample", bound)
        )
    out["oracle"] = summary(base["oracle"])
    text = table(out)
    print(text)
    lengths = [s.lengths for s in steps if s.lengths is not None]
    meta = {"steps": len(steps), "group_size": int(steps[0].rewards.shape[1]), "costs": costs,
            "completion_tokens": float(np.mean([x.mean() for x in lengths])) if lengths else None,
            "rate": out["uniform draw (the control)"]["rate"]}  # fmt: skip
    print(json.dumps(meta))
    if args.out:
        d = Path(args.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "unseen_score.json").write_text(json.dumps({"rows": out, "meta": meta}, indent=1))
        (d / "unseen_score.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
