"""Progress and summary of tiny CPU runs, read from their run directories (``openrlhf_dppo.run_dir``).

    python -m openrlhf_dppo.tiny.progress follow RUN_DIR --name grpo --steps 32 --eval-steps 10 --pid PID
    python -m openrlhf_dppo.tiny.progress summary RUN_DIR [RUN_DIR ...]

``follow`` prints one line per step and evaluation while ``PID`` lives, with the time left
(``time_left``); ``summary`` gives the held-out comparison and its noise by the compare report's rules,
then step times and tokens.
"""

from __future__ import annotations

import argparse
import os
import time

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.run_dir import read_metrics  # noqa: F401 - the one reader; kept here for callers

NAN = float("nan")


def _reward(row: dict) -> float:
    value = R.number(row.get(R.REWARD_HT, row.get(R.REWARD_MEAN, row.get("reward"))))
    return NAN if value is None else value


ETA_AFTER = 3  # training steps seen before the time left is estimated (the first one carries warm-up)
ETA_WINDOW = 10  # the latest step times it is estimated from (DPPO's steps shorten once prompts repeat)


def time_left(rows: list[dict], steps: int | None, eval_every: int | None) -> float | None:
    """Seconds left in a run: the steps to go times the median of the latest ``ETA_WINDOW`` step times,
    plus the evaluations to go (every multiple of ``eval_every`` after the last eval line) times their
    mean time so far. None before ``ETA_AFTER`` steps or without ``steps``."""
    train = [r for r in rows if r.get(R.KIND) == R.TRAIN and R.number(r.get(R.STEP_TOTAL)) is not None]
    if not steps or len(train) < ETA_AFTER:
        return None
    recent = sorted(float(r[R.STEP_TOTAL]) for r in train[-ETA_WINDOW:])
    mid = len(recent) // 2
    median = recent[mid] if len(recent) % 2 else (recent[mid - 1] + recent[mid]) / 2
    done = max(int(r[R.STEP]) for r in train)
    left = max(steps - done, 0) * median
    evals = [r for r in rows if r.get(R.KIND) == R.EVAL]
    times = [t for t in (R.number(r.get(R.EVAL_TIME)) for r in evals) if t is not None]
    if eval_every and times:
        last_eval = max(int(r[R.STEP]) for r in evals)
        left += (steps // eval_every - last_eval // eval_every) * sum(times) / len(times)
    return left


def duration(seconds: float) -> str:
    """``"45 s"``, ``"3 min 20 s"``, ``"1 h 05 min"``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def step_line(name: str, row: dict, steps: int | None, left: float | None = None) -> str:
    total = f"/{steps}" if steps else ""
    parts = [
        f"[{name}] step {row[R.STEP]}{total}",
        f"reward {_reward(row):.3f}",
        f"step {row.get(R.STEP_TOTAL, NAN):.1f}s",
        f"tokens gen {row.get(R.TOKENS_GENERATED, 0):.0f} / trained {row.get(R.TOKENS_TRAINED, 0):.0f}"
        f" / pruned {row.get(R.TOKENS_PRUNED, 0):.0f}"
        + (f" / filtered {row[R.TOKENS_FILTERED]:.0f}" if row.get(R.TOKENS_FILTERED) else ""),
    ]
    if R.PROMPTS_PRUNED in row and row.get(R.PROMPTS_DRAWN):
        parts.append(f"prompts pruned {row[R.PROMPTS_PRUNED]:.0f}/{row[R.PROMPTS_DRAWN]:.0f}")
    if left is not None:
        parts.append(f"about {duration(left)} left")
    return "  ".join(parts)


def eval_line(name: str, row: dict) -> str:
    vals = {k: v for k, v in row.items() if k.startswith(R.EVAL_PREFIX) and R.number(v) is not None}
    return f"[{name}] eval at step {row[R.STEP]}: " + ", ".join(
        f"{k} {v:.3f}" for k, v in sorted(vals.items())
    )


def follow(
    run_dir: str,
    name: str,
    steps: int | None,
    pid: int | None,
    poll: float = 2.0,
    eval_every: int | None = None,
) -> None:
    seen = 0
    while True:
        alive = pid is None or _alive(pid)
        rows = R.read_metrics(run_dir)
        for i, row in enumerate(rows[seen:], start=seen):
            if row.get(R.KIND) == R.TRAIN:
                left = time_left(rows[: i + 1], steps, eval_every)
                print(step_line(name, row, steps, left), flush=True)
            elif row.get(R.KIND) == R.EVAL:
                print(eval_line(name, row), flush=True)
        seen = len(rows)
        if not alive:
            return
        time.sleep(poll)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie (exited, not yet reaped by the shell) counts as ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _fmt(value, spec: str) -> str:
    return "—" if value is None else f"{value:{spec}}"


def print_summary(run_dirs: list[str]) -> object | None:
    """Print the held-out comparison, then time and tokens per run; returns the compare Report."""
    from openrlhf_dppo.report import RunDirError, Settings, build_report, load_run
    from openrlhf_dppo.report.headline import headline
    from openrlhf_dppo.report.run import run_names

    runs = []
    for path, name in zip(run_dirs, run_names(run_dirs)):
        try:
            runs.append(load_run(path, name))
        except RunDirError as err:
            print(f"{path}: {err}")
    if not runs:
        return None
    report = build_report(runs, Settings())
    print("\n== held-out accuracy (the comparison that counts) ==")
    if report.heldout is None:
        print(
            "no held-out eval in these runs: learning is not compared (the training reward is no held-out measure)"
        )
    for s in report.summaries:
        if s.heldout is None:
            continue
        points = " ".join(
            f"{step}:{p:.3f}" + ("" if s.heldout.se(p) is None else f"±{s.heldout.se(p):.3f}")
            for step, p in zip(s.heldout.steps, s.heldout.raw)
        )
        n = _fmt(s.heldout.n_samples, ".0f")
        print(f"{s.run.name} ({report.heldout}, step:pass@1±SE, n = {n} per point): {points}")
    for line in headline(report):
        print(line)
    for warning in report.warnings:  # all of them: any may bear on the lines above
        print(f"note: {warning}")

    print("\n== time (training time = sum of step times; start-up and eval apart) and tokens ==")
    head = (
        f"{'run':20} {'steps':>5} {'median step s':>13} {'training s':>10} {'start-up s':>10} {'eval s':>7}"
    )
    print(
        head
        + f" {'tok generated':>13} {'trained':>8} {'pruned':>7} {'filtered':>8}  training reward first->last"
    )
    for s in report.summaries:
        tot = s.totals
        first = _fmt(s.reward_raw[0] if s.reward_raw else None, ".3f")
        print(
            f"{s.run.name[-20:]:20} {s.steps:>5} {_fmt(s.step_time, '.2f'):>13} {_fmt(s.train_time, '.1f'):>10}"
            f" {_fmt(s.startup, '.1f'):>10} {_fmt(s.eval_time, '.1f'):>7} {_fmt(tot[R.TOKENS_GENERATED], '.0f'):>13}"
            f" {_fmt(tot[R.TOKENS_TRAINED], '.0f'):>8} {_fmt(tot[R.TOKENS_PRUNED], '.0f'):>7}"
            f" {_fmt(tot[R.TOKENS_FILTERED], '.0f'):>8}"
            f"  {first} -> {_fmt(s.final_reward, '.3f')} ({s.reward_key})"
        )
    return report


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("follow", help="print one line per step while a run is going")
    f.add_argument("run_dir")
    f.add_argument("--name", default="run")
    f.add_argument("--steps", type=int, default=None)
    f.add_argument("--pid", type=int, default=None, help="stop when this process has ended")
    f.add_argument("--eval-steps", type=int, default=None, help="the run evaluates every this many steps")
    s = sub.add_parser("summary", help="compare finished runs, held-out accuracy first")
    s.add_argument("run_dirs", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "follow":
        follow(args.run_dir, args.name, args.steps, args.pid, eval_every=args.eval_steps)
    else:
        print_summary(args.run_dirs)


if __name__ == "__main__":
    main()
