"""Build the embedded default: a tiny Qwen3, its tokenizer, the addition task, and a warm start.

    python -m openrlhf_dppo.tiny.build --out .cache/tiny --seed 0 [--size s] [--task addition|countdown]

Writes ``model/`` (Qwen3, bf16, + tokenizer), ``data/{train,eval,dev,warm}.jsonl`` and ``build_info.json``.
The warm start (``WARM``) gives the same weights on every machine. Nothing is rebuilt while
``build_info.json`` carries the current fingerprint (``--force`` rebuilds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

from openrlhf_dppo import precision
from openrlhf_dppo.tiny import task
from openrlhf_dppo.tiny.arithmetic import build_in_pinned_child, needs_pinned_child
from openrlhf_dppo.tiny.assets import (  # noqa: F401
    DEFAULT_SIZE,
    HEAD_DIM,
    SIZES,
    WARM,
    hash_sources,
    model_config,
    parse_size,
    paths,
    train_and_save,
)
from openrlhf_dppo.tiny.tokenizer import EOS_ID, PAD_ID, build_tokenizer

DIGITS, N_EVAL, N_DEV, N_TRAIN = 2, 500, 200, 2000


def fingerprint(seed: int, warm: dict, size: str = DEFAULT_SIZE) -> str:
    """Hash of everything the build output depends on: sources' code, model config, split sizes, seed."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    names = ("task.py", "tokenizer.py", "build.py", "assets.py", "arithmetic.py", "warm.py")
    hash_sources(h, [os.path.join(here, name) for name in names])
    h.update(
        json.dumps([seed, model_config(size), DIGITS, N_EVAL, N_DEV, N_TRAIN, warm], sort_keys=True).encode()
    )
    return h.hexdigest()[:16]


def is_built(out: str, seed: int = 0, warm: dict | None = None, size: str = DEFAULT_SIZE) -> bool:
    p = paths(out)
    if not all(os.path.exists(x) for x in p.values()):
        return False
    with open(p["info"]) as f:
        return json.load(f).get("fingerprint") == fingerprint(seed, warm or WARM, size)


def accuracy(
    model, tok, rows: list[dict], temperature: float = 0.0, seed: int = 0, max_new: int = 6, samples: int = 1
) -> float:
    """Mean exact-answer reward on ``rows``: greedy, or sampled at ``temperature`` (``samples`` per row,
    seeded generator). The same reward as ``openrlhf_dppo/rewards/arithmetic.py``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    rows = [r for r in rows for _ in range(samples)]
    correct = 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), 512):
            chunk = rows[start : start + 512]
            seqs = [tok(r["input"], add_special_tokens=False)["input_ids"] for r in chunk]
            outs = [[] for _ in chunk]
            done = [False] * len(chunk)
            for _ in range(max_new):
                width = max(len(s) for s in seqs)
                ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for i, s in enumerate(seqs):  # left padding: the last position is the next-token slot
                    ids[i, width - len(s) :] = torch.tensor(s)
                    mask[i, width - len(s) :] = 1
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
                if temperature > 0:
                    nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
                else:
                    nxt = logits.argmax(-1)
                for i, t in enumerate(nxt.tolist()):
                    if not done[i]:
                        seqs[i] = seqs[i] + [t]
                        outs[i].append(t)
                        done[i] = t == EOS_ID
                if all(done):
                    break
            for r, o in zip(chunk, outs):
                text = tok.decode([t for t in o if t != EOS_ID])
                correct += int(EOS_ID in o and text == r["label"])
    model.train()
    return correct / len(rows)


def build(out: str, seed: int = 0, warm: dict | None = None, size: str = DEFAULT_SIZE, log=print) -> dict:
    """Build everything under ``out`` and return the build info (see module docstring)."""
    warm = dict(WARM, **(warm or {}))
    if needs_pinned_child(warm):
        return build_in_pinned_child(out, seed, warm, size, "addition")
    splits = task.split(seed, N_EVAL, N_DEV, N_TRAIN, digits=DIGITS)

    def measure(model, tok):
        return {
            "dev_greedy_acc": accuracy(model, tok, splits["dev"]),
            "eval_greedy_acc": accuracy(model, tok, splits["eval"]),
            "eval_sampled_acc": accuracy(model, tok, splits["eval"], temperature=1.0, seed=seed, samples=4),
        }

    header = {"fingerprint": fingerprint(seed, warm, size), "seed": seed, "size": size}
    info = train_and_save(
        out, seed, warm, model_config(size), build_tokenizer(), splits, splits["warm"], measure, header, log
    )
    w = info["warm_start"]
    log(
        f"[tiny] built {out} in {info['build_seconds']}s: held-out greedy acc {w['eval_greedy_acc']:.3f},"
        f" sampled (T=1, 4 per prompt) {w['eval_sampled_acc']:.3f}"
    )
    return info


def ensure_built(
    out: str,
    seed: int = 0,
    force: bool = False,
    size: str = DEFAULT_SIZE,
    warm: dict | None = None,
    log=print,
) -> dict:
    """Build unless a build with the same fingerprint is already there; return the build info."""
    warm = dict(WARM, **(warm or {}))
    if not force and is_built(out, seed, warm, size):
        with open(paths(out)["info"]) as f:
            return json.load(f)
    return build(out, seed, warm, size, log)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".cache/tiny", help="output directory")
    ap.add_argument("--seed", type=int, default=0, help="seed of the task split, the init and the warm start")
    ap.add_argument(
        "--size", default=DEFAULT_SIZE, help=f"one of {sorted(SIZES)} or HIDDENxLAYERSxINTERMEDIATE"
    )
    ap.add_argument("--force", action="store_true", help="rebuild even when the cached build is current")
    ap.add_argument(
        "--task",
        default="addition",
        choices=("addition", "countdown"),
        help="addition, or countdown (tiny/countdown.py)",
    )
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)  # JSON {warm, extra}: the pinned child's
    args = ap.parse_args(argv)
    try:
        parse_size(args.size)
    except ValueError as e:
        ap.error(str(e))
    spec = json.loads(args.spec) if args.spec else {"warm": None, "extra": {}}
    precision.separate_inductor_cache()  # before torch loads; the pinned child chooses its own (capped)
    if args.task == "countdown":
        from openrlhf_dppo.tiny import countdown  # loaded only when asked for (reasoning-gym)

        info = countdown.ensure_built(
            args.out, args.seed, force=args.force, size=args.size, warm=spec["warm"], **spec["extra"]
        )
    else:
        info = ensure_built(args.out, args.seed, force=args.force, size=args.size, warm=spec["warm"])
    print(json.dumps({k: info[k] for k in ("fingerprint", "params", "warm_start")}))


if __name__ == "__main__":
    main()
