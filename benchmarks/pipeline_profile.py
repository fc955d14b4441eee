"""Where a pipeline run's CPU time goes: py-spy on the Ray actors of one benchmark run.

    python benchmarks/pipeline_profile.py --run runs/pipeline/dppo_05_05_openrlhf --seconds 60

Waits for the CLI process whose command line names the run directory, finds its descendant Ray actor
processes (the trainer, the policy actor, the vLLM engine core), records each with ``py-spy record
--format raw`` (active samples only, 20 Hz) for ``--seconds``, and prints for each process the share
of samples by top-level bucket: DPPO code (any frame in openrlhf_dppo/, outside the reward file),
torch forward/backward/optimizer, and the rest. The raw stacks are kept in the run directory.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from openrlhf_dppo.run_dir import read_metrics  # noqa: E402 - the one reader of metrics.jsonl

NAMES = ("_DPPOTrainer", "_DPPOPolicyModelActor", "PPOTrainer", "PolicyModelActor", "EngineCore")


def find_cli(run: str) -> psutil.Process:
    for _ in range(3600):
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "train_dppo_ray" in cmd and f"{run} " in cmd + " ":
                return p
        time.sleep(1)
    sys.exit(f"no CLI process for {run}")


def actors(cli: psutil.Process) -> dict[str, int]:
    found = {}
    for child in cli.children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        for name in NAMES:
            if name in title and name not in found and not any(name in f for f in found):
                found[name] = child.pid
    return found


def bucket(stack: str) -> str:
    frames = stack.split(";")
    if any("openrlhf_dppo" in f and "rewards" not in f for f in frames):
        return "openrlhf_dppo code (incl. calls it makes)"
    if any("backward" in f for f in frames):
        return "backward"
    if any("step (torch/optim" in f or "adam" in f.lower() for f in frames):
        return "optimizer"
    if any("forward" in f for f in frames):
        return "forward"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--after_step", type=int, default=3, help="start once metrics.jsonl has this many lines")
    args = ap.parse_args()
    run = str((ROOT / args.run).resolve())
    cli = find_cli(run)
    while len(read_metrics(run)) < args.after_step:
        time.sleep(1)
    procs = actors(cli)
    print(f"profiling {procs} for {args.seconds} s")
    spy = str(ROOT / ".venv" / "bin" / "py-spy")
    jobs = {}
    for name, pid in procs.items():
        out = Path(run) / f"pyspy_{name}.txt"
        cmd = [
            spy,
            "record",
            "-p",
            str(pid),
            "-d",
            str(args.seconds),
            "-r",
            "20",
            "-f",
            "raw",
            "-o",
            str(out),
        ]
        jobs[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
    for name, (job, out) in jobs.items():
        job.wait()
        counts: collections.Counter = collections.Counter()
        tops: collections.Counter = collections.Counter()
        if out.exists():
            for line in out.read_text().splitlines():
                stack, _, n = line.rpartition(" ")
                counts[bucket(stack)] += int(n)
                dppo = [f for f in stack.split(";") if "openrlhf_dppo" in f]
                if dppo:
                    tops[dppo[-1].split(" (")[0] + " " + dppo[-1].split("/")[-1]] += int(n)
        total = sum(counts.values())
        print(f"\n{name} (pid {procs[name]}): {total} active samples at 20 Hz")
        for k, v in counts.most_common():
            print(f"  {k}: {v / max(total, 1):.1%}")
        for k, v in tops.most_common(8):
            print(f"    innermost openrlhf_dppo frame {k}: {v / max(total, 1):.1%}")


if __name__ == "__main__":
    main()
