"""Every command line in the README and docs/ runs through the parser it names: the training CLI
(``train_dppo_ray.main`` with a stand-in for training), the recipe behind each script, compare, eval,
data preparation, the Slurm launcher; an sbatch line asks for GPUs; a make target exists."""

from __future__ import annotations

import re
import shlex

import pytest
from cli_commands import GRPO, ROOT, parse

from openrlhf_dppo.cli import advise, compare
from openrlhf_dppo.cli import eval as eval_cli
from openrlhf_dppo.data import prepare
from openrlhf_dppo.launch import slurm
from openrlhf_dppo.recipe import load_config

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# what a doc writes for "your own GRPO flags"
PLACEHOLDERS = ("<your GRPO flags>", "<every openrlhf.cli.train_ppo_ray flag>")
RUNS_THE_PROJECT = re.compile(
    r"^\s*(?:[A-Z_]+=\S*\s+)*(?:openrlhf-dppo |sbatch |make |python -m openrlhf_dppo|bash (?:examples|scripts|slurm)/)"
)
MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where, tokens) of every command line in the docs' code blocks that runs this project: continued
    lines joined, comments and optional ``[...]`` parts dropped, a leading ``VAR=value`` kept."""
    found = []
    for doc in DOCS:
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            if lang == "diff":
                block = "\n".join(line[1:] for line in block.splitlines() if line[:1] != "-")
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                if not RUNS_THE_PROJECT.match(line):
                    continue
                for ph in PLACEHOLDERS:
                    line = line.replace(ph, "__GRPO__")
                line = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), line)  # one word
                tokens = shlex.split(re.sub(r"\[[^\]]*\]", "", line), comments=True)
                found.append((f"{doc.name}: {line.strip()}", tokens))
    return found


def _training(argv: list[str]) -> None:
    parse([a for t in argv for a in (GRPO if t == "__GRPO__" else [t])])


def _script_config(script: str) -> str:
    """The recipe a training script expands (``python -m openrlhf_dppo.recipe <config>``)."""
    return str(ROOT / re.search(r"configs/\w+\.yaml", (ROOT / script).read_text()).group(0))


def check(tokens: list[str], monkeypatch) -> None:
    env = dict(t.split("=", 1) for t in tokens if re.match(r"^[A-Z_]+=", t))
    cmd = [t for t in tokens if t.split("=", 1)[0] not in env]
    head, args = cmd[:3], cmd[3:]
    if cmd[:2] == ["openrlhf-dppo", "compare"]:
        compare.build_parser().parse_intermixed_args(cmd[2:])
    elif cmd[:2] == ["openrlhf-dppo", "advise"]:
        advise.build_parser().parse_args(cmd[2:])
    elif cmd[:2] == ["openrlhf-dppo", "train"] or head[2:] == ["openrlhf_dppo.cli.train_dppo_ray"]:
        _training(cmd[2:] if cmd[0] == "openrlhf-dppo" else args)
    elif head[2:] == ["openrlhf_dppo.recipe"]:
        _training(load_config(str(ROOT / args[0]), environ={}) + [a for a in args[1:] if a != "--dry-run"])
    elif head[2:] == ["openrlhf_dppo.cli.eval"]:
        eval_cli.build_parser().parse_args(args)
    elif head[2:] == ["openrlhf_dppo.launch.slurm"]:
        slurm.build_parser().parse_args(args)
    elif head[2:] == ["openrlhf_dppo.data.prepare"]:
        monkeypatch.setattr(prepare, "prepare", lambda *a: {})  # parse the flags, download nothing
        assert prepare.main(args) == 0
    elif cmd[0] == "bash" and re.fullmatch(r"examples/scripts/train_\w+_qwen3\.sh", cmd[1]):
        _training(load_config(_script_config(cmd[1]), environ={}) + cmd[2:])
    elif cmd[:2] == ["bash", "scripts/setup_gpu.sh"]:
        usage = re.search(
            r"usage: bash scripts/setup_gpu\.sh \[([^]]+)\]", (ROOT / cmd[1]).read_text()
        ).group(1)
        assert set(cmd[2:]) <= set(usage.split(" | ")) and len(cmd) <= 3, cmd  # its usage line; more exits 2
    elif cmd[:2] == ["bash", "slurm/local_cluster.sh"]:
        usage = re.search(r"usage: \$0 ([\w|]+)", (ROOT / cmd[1]).read_text()).group(1)
        assert len(cmd) == 3 and cmd[2] in usage.split("|"), cmd
    elif cmd[0] == "sbatch":
        assert (ROOT / cmd[-1]).is_file() and (ROOT / env["CONFIG"]).is_file(), cmd
        gpus = re.search(r"--gpus-per-node[ =](\d+)|--gres[ =]gpu", " ".join(cmd))
        assert gpus and gpus.group(1) != "0", "an sbatch line must ask for GPUs: Ray sees only those"
    elif cmd[0] == "make":
        assert cmd[1] in MAKE_TARGETS, cmd
    else:
        pytest.fail(f"no check for this command: add one to {__file__}")


COMMANDS = doc_commands()


def test_the_docs_hold_the_commands_a_user_runs():
    where = " ".join(w for w, _ in COMMANDS)
    for text in ("train_dppo_ray", "compare", "launch.slurm", "sbatch", "make demo", "make test"):
        assert text in where, text


@pytest.mark.parametrize("tokens", [t for _, t in COMMANDS], ids=[w[:90] for w, _ in COMMANDS])
def test_every_command_line_in_the_docs_parses(tokens, monkeypatch):
    monkeypatch.chdir(ROOT)
    check(tokens, monkeypatch)


@pytest.mark.parametrize(
    "line",
    [
        "CONFIG=configs/dppo_qwen3_4b_math.yaml sbatch --nodes 2 slurm/dppo_ray.sbatch",  # asks for no GPU
        "python -m openrlhf_dppo.cli.train_dppo_ray <your GRPO flags> --dppo.prompt_prune_rate 1.5",
        "openrlhf-dppo compare --no-such-flag",
        "openrlhf-dppo advise runs/grpo_s1 --no-such-flag",
        "make no-such-target",
    ],
)
def test_a_wrong_command_line_fails_its_check(line, monkeypatch):
    for ph in PLACEHOLDERS:
        line = line.replace(ph, "__GRPO__")
    monkeypatch.chdir(ROOT)
    with pytest.raises((AssertionError, SystemExit)):
        check(shlex.split(line), monkeypatch)
