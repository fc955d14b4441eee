"""Readings along the tiny task's warm start: dev and held-out greedy accuracy every N supervised steps.

    ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 python benchmarks/warm_start_curve.py --steps 1700 --every 25 \
        --out curve.jsonl

Runs the build's own warm start (``tiny/warm.py``, ``WARM`` of ``tiny/build.py``, seed 0, size ``s``) and,
every ``--every`` steps, reads a bf16 copy of the model (cast through float32, so a last digit can differ
from the build's own reading) on the dev and held-out splits. The readings draw no random numbers, so the
training is the build's. Set the two variables above to read the pinned trajectory the build uses
(``tiny/arithmetic.py``); without them it is this CPU's own. One JSON line per reading.
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1700, help="supervised steps in all")
    ap.add_argument("--every", type=int, default=25, help="read the accuracies every this many steps")
    ap.add_argument("--out", default="warm_start_curve.jsonl", help="JSON lines: step, seconds, dev, eval")
    args = ap.parse_args(argv)

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from openrlhf_dppo.tiny import build, task, warm
    from openrlhf_dppo.tiny.tokenizer import build_tokenizer

    torch.set_num_threads(build.WARM["threads"])
    tok = build_tokenizer()
    splits = task.split(0, build.N_EVAL, build.N_DEV, build.N_TRAIN, digits=build.DIGITS)
    config = Qwen3Config(**build.model_config())
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(getattr(torch, build.WARM["dtype"]))
    t0 = time.time()
    with open(args.out, "w") as out:

        def probe(step, trained):
            copy = Qwen3ForCausalLM(config)
            copy.load_state_dict(trained.state_dict())
            copy = copy.to(torch.bfloat16)
            row = {
                "step": step,
                "t": round(time.time() - t0, 1),
                "dev": build.accuracy(copy, tok, splits["dev"]),
                "eval": build.accuracy(copy, tok, splits["eval"]),
            }
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)

        settings = dict(build.WARM, steps=args.steps, log_every=args.every)
        warm.warm_start(model, tok, splits["warm"], settings, 0, probe=probe, log=lambda *_: None)


if __name__ == "__main__":
    main()
