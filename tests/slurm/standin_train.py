"""A stand-in for the training CLI with the same contract the Slurm launcher relies on (seconds, not minutes).

It takes the OpenRLHF checkpoint flags the launcher adds (`--ckpt.output_dir --ckpt.path
--ckpt.load_enable --ckpt.save_steps`), connects to the Ray cluster in RAY_ADDRESS, requires
`--nodes` alive nodes, and each step runs one Ray task per node (SPREAD). Its "prompt history" maps a
prompt index to how often it was trained; the dataloader position is the step. Every `save_steps`
steps it writes a checkpoint in DeepSpeed's layout (`<ckpt>/_actor/global_step<N>/state.json` with the
history and the step, then `<ckpt>/_actor/latest`), and with --ckpt.load_enable it resumes from the
newest one and logs a `{"kind": "resume"}` line with the loaded step and history. Lines go to
`<output_dir>/metrics.jsonl`; status.json is written as the real trainer does ("running" with the
restored step once the checkpoint is loaded and after every step, "finished" at the end).
"""

import argparse
import json
import os
import time
from pathlib import Path

import ray


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt.output_dir", dest="output_dir", required=True)
    p.add_argument("--ckpt.path", dest="ckpt_path", required=True)
    p.add_argument("--ckpt.load_enable", dest="load", action="store_true")
    p.add_argument("--ckpt.save_steps", dest="save_steps", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=6)
    p.add_argument("--prompts_per_step", type=int, default=2)
    p.add_argument("--step_seconds", type=float, default=1.0)
    p.add_argument("--nodes", type=int, default=1)
    args = p.parse_args()

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    actor = Path(args.ckpt_path) / "_actor"

    def log(line: dict) -> None:
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def status(state: str, step: int) -> None:
        write_json(
            out / "status.json",
            {"state": state, "step": step, "max_steps": args.max_steps, "updated": time.time()},
        )

    step, history = 0, {}
    if args.load and (actor / "latest").exists():
        state = json.loads((actor / (actor / "latest").read_text().strip() / "state.json").read_text())
        step, history = state["step"], state["history"]
        log({"kind": "resume", "step": step, "history": history, "time": time.time()})
    status("running", step)

    ray.init(address=os.environ["RAY_ADDRESS"])
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == args.nodes, f"expected {args.nodes} Ray nodes, found {len(alive)}"

    @ray.remote(num_cpus=0, scheduling_strategy="SPREAD")
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    while step < args.max_steps:
        node_ids = ray.get([where.remote() for _ in range(args.nodes)])
        time.sleep(args.step_seconds)
        first = step * args.prompts_per_step
        for idx in range(first, first + args.prompts_per_step):  # the dataloader position is the step
            history[str(idx)] = history.get(str(idx), 0) + 1
        step += 1
        log({"kind": "train", "step": step, "time": time.time(), "nodes_used": len(set(node_ids))})
        if step % args.save_steps == 0:
            tag = actor / f"global_step{step}"
            tag.mkdir(parents=True, exist_ok=True)
            write_json(tag / "state.json", {"step": step, "history": history})
            (actor / "latest").write_text(tag.name)
        status("running", step)
    ray.shutdown()
    status("finished", step)


if __name__ == "__main__":
    main()
