"""The `openrlhf-dppo` console script: ``SUBCOMMANDS`` names the module of each subcommand, imported only
when it runs; its ``main`` receives the remaining arguments unchanged."""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "train": (
        "openrlhf_dppo.cli.train_dppo_ray",
        "train with DPPO (or plain GRPO) on OpenRLHF's Ray pipeline",
    ),
    "eval": ("openrlhf_dppo.cli.eval", "evaluate a checkpoint on math benchmarks (writes eval_results.json)"),
    "compare": ("openrlhf_dppo.cli.compare", "compare run directories: speedups, report.md and plots"),
    "advise": (
        "openrlhf_dppo.cli.advise",
        "what a run's logs say about pruning on its task: the flags to run",
    ),
}


def usage() -> str:
    lines = ["usage: openrlhf-dppo {" + ",".join(SUBCOMMANDS) + "} [args ...]", "", "subcommands:"]
    lines += [f"  {name:<9}{help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines.append("\n'openrlhf-dppo SUBCOMMAND --help' shows the arguments of one subcommand.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"openrlhf-dppo: unknown subcommand {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    # modules that read sys.argv (argparse's prog) see the subcommand's arguments under its own name
    sys.argv = [f"openrlhf-dppo {command}", *rest]
    result = importlib.import_module(SUBCOMMANDS[command][0]).main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
