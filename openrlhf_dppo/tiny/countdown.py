"""The second embedded task: countdown with 3 or 4 numbers in 1..9, from reasoning-gym (0.1.25).

A prompt is ``"<numbers>><target>:"`` and the completion a scratchpad, then ``;`` and the answer:
``"4,7,3>25:"  ->  "4*7=28,28-3=25;(4*7)-3"``. A row's ``label`` is the scorer's metadata as JSON
(``rewards/countdown.py``), ``solution`` the scratchpad the warm start learns. Deterministic for a seed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random

from openrlhf_dppo.tiny import arithmetic, assets, task, tokenizer

GENERATOR = dict(min_numbers=3, max_numbers=4, min_value=1, max_value=9, min_target=1, max_target=99)
N_DRAWS, N_EVAL, N_DEV, N_TRAIN = 30_000, 500, 200, 2000  # about 9,700 distinct problems from 30,000 draws
CHARS = list("-*/(),>:;")  # added after the first task's characters (tokenizer.CHARS): its ids unchanged
MAX_NEW_TOKENS = 48  # the longest scratchpad + <eos> fits (tested on the built splits)
MAX_LEN = 64  # prompt (<= 11 characters) + MAX_NEW_TOKENS
OPS = "+-*/"


def _apply(acc: int, op: str, x: int) -> int | None:
    if op == "+":
        return acc + x
    if op == "-":
        return acc - x
    if op == "*":
        return acc * x
    return acc // x if acc % x == 0 else None  # countdown's division must be exact


def solve(numbers: list[int], target: int) -> tuple[list[tuple[int, str, int, int]], str] | None:
    """A left fold of ``numbers`` that equals ``target``: (steps ``(a, op, b, a op b)``, expression).

    The first such fold with every intermediate >= 0 in the order (number orders, operators ``+-*/``),
    else the first with any intermediate; None when there is none.
    """
    fallback = None
    for order in itertools.permutations(numbers):
        for ops in itertools.product(OPS, repeat=len(numbers) - 1):
            acc, steps = order[0], []
            for op, x in zip(ops, order[1:]):
                nxt = _apply(acc, op, x)
                if nxt is None:
                    break
                steps.append((acc, op, x, nxt))
                acc = nxt
            else:
                if acc != target:
                    continue
                expr = str(order[0])
                for k, (_, op, x, _) in enumerate(steps):
                    expr = f"({expr}){op}{x}" if k else f"{expr}{op}{x}"
                if all(s[3] >= 0 for s in steps):
                    return steps, expr
                fallback = fallback or (steps, expr)
    return fallback


def scratchpad(steps: list[tuple[int, str, int, int]], expr: str) -> str:
    """``"4*7=28,28-3=25;(4*7)-3"``: the steps, then ``;`` and the answer expression."""
    return ",".join(f"{a}{op}{b}={c}" for a, op, b, c in steps) + ";" + expr


def row(numbers: list[int], target: int) -> dict:
    """One problem as a dataset row: ``input`` (prompt), ``label`` (scorer metadata), ``solution``."""
    solved = solve(numbers, target)
    if solved is None:
        raise ValueError(f"no left-fold solution for {numbers} -> {target}")
    return {
        "input": ",".join(map(str, numbers)) + f">{target}:",
        "label": json.dumps({"numbers": list(numbers), "target": target}),
        "solution": scratchpad(*solved),
    }


def problems(seed: int, n_draws: int) -> list[dict]:
    """The distinct problems among ``n_draws`` generator draws, in draw order (first order kept)."""
    import reasoning_gym

    rows, seen = [], set()
    for item in reasoning_gym.create_dataset("countdown", size=n_draws, seed=seed, **GENERATOR):
        meta = item["metadata"]
        key = (tuple(sorted(meta["numbers"])), meta["target"])
        if key not in seen:
            seen.add(key)
            rows.append(row(meta["numbers"], meta["target"]))
    return rows


def split(
    seed: int, n_eval: int = N_EVAL, n_dev: int = N_DEV, n_train: int = N_TRAIN, n_draws: int = N_DRAWS
) -> dict[str, list[dict]]:
    """The four disjoint splits (``task.SPLITS``; ``warm`` gets the rest). ValueError when too few."""
    rows = problems(seed, n_draws)
    if n_eval + n_dev + n_train >= len(rows):
        raise ValueError(
            f"n_eval + n_dev + n_train = {n_eval + n_dev + n_train} leaves no warm-start data among the"
            f" {len(rows)} distinct problems of {n_draws} draws"
        )
    random.Random(seed).shuffle(rows)
    cuts = [0, n_eval, n_eval + n_dev, n_eval + n_dev + n_train, len(rows)]
    return {name: rows[cuts[k] : cuts[k + 1]] for k, name in enumerate(task.SPLITS)}


# ---- the build: same model size, build command and warm-start rule as the first task (tiny/assets.py) ----

VOCAB = tokenizer.VOCAB + CHARS  # the task's own vocabulary: the first task's model and ids are untouched
# state_bits None: the state is not rounded (the weights its results were measured on), so MKL makes
# them differ between CPU vendors
WARM = dict(assets.WARM, steps=1200, state_bits=None)
COUNTS = dict(n_eval=N_EVAL, n_dev=N_DEV, n_train=N_TRAIN, n_draws=N_DRAWS)  # split()'s sizes


def model_config(size: str = assets.DEFAULT_SIZE) -> dict:
    """``transformers.Qwen3Config`` keyword arguments: the first task's ``size`` on this vocabulary."""
    return assets.model_config(size, vocab_size=len(VOCAB))


def fingerprint(seed: int, warm: dict, size: str = assets.DEFAULT_SIZE, counts: dict = COUNTS) -> str:
    """Hash of everything the build output depends on: sources' code, generator version and settings, seed."""
    from importlib.metadata import version

    h = hashlib.sha256()
    tiny = os.path.dirname(os.path.abspath(__file__))
    names = ("countdown.py", "task.py", "tokenizer.py", "assets.py", "warm.py", "arithmetic.py")
    sources = [os.path.join(tiny, n) for n in names]
    assets.hash_sources(h, [*sources, os.path.join(os.path.dirname(tiny), "rewards", "countdown.py")])
    spec = [seed, model_config(size), GENERATOR, counts, warm, version("reasoning-gym")]
    h.update(json.dumps(spec, sort_keys=True).encode())
    return h.hexdigest()[:16]


def solve_rates(model, tok, rows: list[dict], temperature: float = 0.0, seed: int = 0, samples: int = 1):
    """(solve rate, mean score) of ``rows`` under the reward file's scorer: greedy, or ``samples`` per row
    sampled at ``temperature`` (seeded). Completions up to ``MAX_NEW_TOKENS`` (transformers' generate)."""
    import torch

    from openrlhf_dppo.rewards import countdown as reward

    torch.manual_seed(seed)
    rows = [r for r in rows for _ in range(samples)]
    scores = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), 256):
            chunk = rows[start : start + 256]
            enc = tok(
                [r["input"] for r in chunk], add_special_tokens=False, return_tensors="pt", padding=True
            )
            sample = dict(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else {}
            out = model.generate(
                **enc,
                max_new_tokens=MAX_NEW_TOKENS,
                eos_token_id=tokenizer.EOS_ID,
                pad_token_id=tokenizer.PAD_ID,
                **(sample or dict(do_sample=False)),
            )
            for r, ids in zip(chunk, out[:, enc["input_ids"].shape[1] :].tolist()):
                text = tok.decode([t for t in ids if t != tokenizer.PAD_ID], skip_special_tokens=False)
                scores.append(reward.score(text, r["label"]))
    model.train()
    return round(sum(s == 1.0 for s in scores) / len(scores), 6), round(sum(scores) / len(scores), 6)


def build_countdown(
    out: str,
    seed: int = 0,
    warm: dict | None = None,
    size: str = assets.DEFAULT_SIZE,
    counts: dict = COUNTS,
    log=print,
) -> dict:
    """Build the countdown assets under ``out`` (``assets.paths``), warm-started on the scratchpads;
    return the info. ``counts``: ``split``'s sizes."""
    warm = dict(WARM, **(warm or {}))
    if arithmetic.needs_pinned_child(warm):
        return arithmetic.build_in_pinned_child(out, seed, warm, size, "countdown", {"counts": counts})
    splits = split(seed, **counts)
    supervised = [{"input": r["input"], "label": r["solution"]} for r in splits["warm"]]  # the target

    def measure(model, tok):
        readings = {}
        for name, rows, kw in (
            ("dev_greedy", splits["dev"], {}),
            ("eval_greedy", splits["eval"], {}),
            ("eval_sampled", splits["eval"], dict(temperature=1.0, seed=seed, samples=4)),
        ):
            readings[f"{name}_acc"], readings[f"{name}_score"] = solve_rates(model, tok, rows, **kw)
        return readings

    header = {
        "task": "countdown",
        "fingerprint": fingerprint(seed, warm, size, counts),
        "seed": seed,
        "size": size,
        "generator": GENERATOR,
    }
    tok = tokenizer.build_tokenizer(VOCAB)
    info = assets.train_and_save(
        out, seed, warm, model_config(size), tok, splits, supervised, measure, header, log
    )
    w = info["warm_start"]
    log(
        f"[tiny] built {out} in {info['build_seconds']}s: held-out greedy solve rate"
        f" {w['eval_greedy_acc']:.3f} (mean score {w['eval_greedy_score']:.3f})"
    )
    return info


def ensure_built(
    out: str,
    seed: int = 0,
    force: bool = False,
    size: str = assets.DEFAULT_SIZE,
    warm: dict | None = None,
    counts: dict = COUNTS,
    log=print,
) -> dict:
    """Build unless a build with the same fingerprint is already there; return the build info."""
    warm = dict(WARM, **(warm or {}))
    p = assets.paths(out)
    if not force and all(os.path.exists(x) for x in p.values()):
        with open(p["info"]) as f:
            info = json.load(f)
        if info.get("fingerprint") == fingerprint(seed, warm, size, counts):
            return info
    return build_countdown(out, seed, warm, size, counts, log=log)
