"""The docs name the code as it is: every module attribute and test a doc cites exists, the accounting
identity is written with the parts the trainer checks, the install hint of a missing OpenRLHF is the
README's, a metric key is not called "not logged" when a recorded run logs it, and the recipe example of
docs/SLURM.md expands as the text around it says. Read from the source (AST) where importing would load
the host; nothing here starts a run."""

from __future__ import annotations

import ast
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "openrlhf_dppo"
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "yaml", "yml", "txt", "sh", "sbatch", "toml", "cfg", "png"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()
SHORT = defaultdict(list)  # "experience_maker" and "adapters.experience_maker" -> the full name
for _name in MODULES:
    _parts = _name.split(".")
    for _i in range(1, len(_parts)):
        SHORT[".".join(_parts[_i:])].append(_name)


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines (defs, classes, assignments, imports), by name."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                out.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, (ast.If, ast.Try)):
            out.update(_names(node.body))
    return out


def _exists(module: str, chain: list[str]) -> bool:
    """Whether ``module.chain[0].chain[1]...`` is defined (a re-export is trusted as far as it goes)."""
    body = ast.parse(MODULES[module].read_text(encoding="utf-8")).body
    for i, name in enumerate(chain):
        defined = _names(body)
        if name not in defined:
            return i == 0 and f"{module}.{name}" in MODULES and _exists(f"{module}.{name}", chain[1:])
        node = defined[name]
        if isinstance(node, ast.ClassDef):
            body = node.body
        elif isinstance(node, ast.ImportFrom):
            return True
        else:
            body = []
    return True


def _resolve(ref: str) -> tuple[str, list[str]] | None:
    """``adapters.step.check_accounting`` -> ("openrlhf_dppo.adapters.step", ["check_accounting"]);
    None when no prefix of the reference names one of our modules (``torch.compile``, ``ray.init``)."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        for full in (head, f"openrlhf_dppo.{head}"):
            if full in MODULES:
                return full, parts[i:]
        if len(SHORT.get(head, [])) == 1:
            return SHORT[head][0], parts[i:]
    return None


def _cited_attributes() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for m in re.finditer(
            r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`", doc.read_text(encoding="utf-8")
        ):
            if m.group(1).rsplit(".", 1)[-1] not in FILE_SUFFIXES:
                out.append((doc.name, m.group(1)))
    return out


def test_every_module_attribute_a_doc_cites_exists():
    cited = [(doc, ref, _resolve(ref)) for doc, ref in _cited_attributes()]
    resolved = [(doc, ref, hit) for doc, ref, hit in cited if hit is not None]
    assert len(resolved) > 30  # the scan finds the docs' references (about 45)
    missing = [f"{doc}: `{ref}`" for doc, ref, (module, chain) in resolved if not _exists(module, chain)]
    assert not missing, missing


def test_the_attribute_check_fails_on_a_renamed_method():
    # experience_maker._whiten was renamed to DPPOExperienceMaker._token_stats; docs/DESIGN.md cited the old name
    assert _exists(*_resolve("experience_maker.DPPOExperienceMaker._token_stats"))
    assert not _exists(*_resolve("experience_maker._whiten"))
    assert not _exists(*_resolve("core.no_such_function"))


def test_every_test_a_doc_cites_exists():
    cited = [
        (doc.name, path, name)
        for doc in DOCS
        for path, name in re.findall(r"`([\w./-]+\.py)::(\w+)`", doc.read_text(encoding="utf-8"))
    ]
    assert len(cited) > 10
    missing = []
    for doc, path, name in cited:
        f = ROOT / path if (ROOT / path).is_file() else PKG / path
        tree = (
            ast.parse(f.read_text(encoding="utf-8")) if f.is_file() else ast.Module(body=[], type_ignores=[])
        )
        if name not in {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}:
            missing.append(f"{doc}: {path}::{name}")
    assert not missing, missing


def _accounting_parts() -> tuple[str, ...]:
    """The parts ``adapters.step.check_accounting`` adds up to the generated count (``parts_of``)."""
    tree = ast.parse((PKG / "adapters" / "step.py").read_text(encoding="utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_accounting")
    assign = next(
        n for n in ast.walk(fn) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "parts_of"
    )
    return tuple(ast.literal_eval(assign.value))


def test_every_accounting_identity_names_the_parts_the_trainer_checks():
    parts = _accounting_parts()
    assert parts == ("trained", "pruned", "filtered", "untrained")
    texts = [*DOCS, *PKG.rglob("*.py")]
    found = []
    for path in texts:
        text = " ".join(path.read_text(encoding="utf-8").split())  # identities broken over lines too
        for m in re.finditer(r"generated = (\w+(?: \+ \w+)+)", text, re.I):
            found.append((path.relative_to(ROOT).as_posix(), tuple(m.group(1).lower().split(" + "))))
    assert len(found) >= 4, found
    wrong = [f"{path}: {' + '.join(p)}" for path, p in found if p != parts]
    assert not wrong, f"expected generated = {' + '.join(parts)}: {wrong}"


def test_a_missing_openrlhf_is_told_the_install_the_readme_gives(monkeypatch):
    from openrlhf_dppo import _host

    monkeypatch.setattr(_host, "installed_openrlhf_version", lambda: None)
    with pytest.raises(_host.OpenRLHFVersionError) as err:
        _host.check_openrlhf_version()
    message = str(err.value)
    assert ".[gpu]" not in message  # the README: `pip install -e ".[gpu]"` alone fails
    scripts = re.findall(r"bash (scripts/\w+\.sh)", message)
    assert "scripts/setup_gpu.sh" in scripts and all((ROOT / s).is_file() for s in scripts), message
    assert "bash scripts/setup_gpu.sh" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_no_metric_key_called_not_logged_is_in_a_recorded_runs_metrics():
    from openrlhf_dppo import metric_keys

    logged = set()
    for metrics in (ROOT / "tests" / "report" / "data").rglob("metrics.jsonl"):
        for line in metrics.read_text(encoding="utf-8").splitlines():
            logged.update(json.loads(line))
    assert (
        metric_keys.SAMPLE_WEIGHT in logged
    )  # OpenRLHF's training_step logs every tensor of Experience.info
    lines = (PKG / "metric_keys.py").read_text(encoding="utf-8").splitlines()
    said = []
    for i, line in enumerate(lines):
        if "not logged" in line.lower():  # the comment's own line, or the assignment after a comment block
            following = next((x for x in lines[i:] if not x.lstrip().startswith("#")), "")
            said += [k for k in re.findall(r'"([\w/]+)"', following) if k in logged]
    assert not said, f"metric_keys.py calls these keys not logged, but a recorded run logs them: {said}"


def _slurm_recipe_example() -> str:
    text = (ROOT / "docs" / "SLURM.md").read_text(encoding="utf-8")
    section = text.split("### Your own flags: a recipe", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_recipe_example_of_slurm_md_expands_as_its_text_says(tmp_path):
    from openrlhf_dppo import recipe

    example = _slurm_recipe_example()
    shutil.copy(ROOT / "configs" / "dppo_qwen3_4b_math.yaml", tmp_path)
    (tmp_path / "my_task.yaml").write_text(example, encoding="utf-8")
    flags = recipe.load_config(str(tmp_path / "my_task.yaml"), environ={})
    base = recipe.load_config(str(ROOT / "configs" / "dppo_qwen3_4b_math.yaml"), environ={})

    def value(argv, name):
        return argv[argv.index(name) + 1]

    assert flags.count("--rollout.n_samples_per_prompt") == 1
    assert value(flags, "--rollout.n_samples_per_prompt") == "16"
    assert flags.index("--rollout.n_samples_per_prompt") < flags.index("--eval.dataset")  # in place
    assert value(flags, "--actor.model_name_or_path") == "/models/my-model"  # a var of the example
    assert value(flags, "--data.prompt_dataset") == "/data/my_task.jsonl"
    assert value(flags, "--ckpt.output_dir").endswith("/runs/my_task/dppo")  # ${REPO_ROOT}
    assert (
        "--actor.gradient_checkpointing_enable" in base
        and "--actor.gradient_checkpointing_enable" not in flags
    )
    # an environment variable wins over a var; the launcher's NNODES reaches the placement flags
    env = recipe.load_config(str(tmp_path / "my_task.yaml"), environ={"MODEL": "/m2", "NNODES": "2"})
    assert value(env, "--actor.model_name_or_path") == "/m2" and value(env, "--actor.num_nodes") == "2"
    assert value(env, "--vllm.num_engines") == "16"  # $((NNODES * GPUS_PER_NODE))


def test_the_recipes_top_level_is_what_slurm_md_lists(tmp_path):
    from openrlhf_dppo import recipe

    text = (ROOT / "docs" / "SLURM.md").read_text(encoding="utf-8")
    listed = re.search(r"The top level takes (.*?), nothing else", text, re.S).group(1)
    keys = set(re.findall(r"`(\w+)`", listed.split("(")[0] + listed.split(")")[-1]))
    (tmp_path / "bad.yaml").write_text("args: {}\nextra: 1\n", encoding="utf-8")
    with pytest.raises(recipe.ConfigError) as err:
        recipe.load_config(str(tmp_path / "bad.yaml"), environ={})
    accepted = set(
        re.search(r"the top level takes (.*?); found", str(err.value))
        .group(1)
        .replace(" and", ",")
        .split(", ")
    )
    assert keys == accepted == {"base", "entry", "vars", "args"}


def test_every_dppo_flag_a_doc_names_exists():
    """README, CONTRIBUTING and docs/ name only ``--dppo.*`` flags the CLI has; the removed ones may be
    named only in FLAGS.md's paragraph that lists them (the benchmark record keeps history as it ran)."""
    import dataclasses

    from openrlhf_dppo.cli.flags import RunOptions
    from openrlhf_dppo.core.config import DPPOConfig

    flags = {f.name for f in (*dataclasses.fields(DPPOConfig), *dataclasses.fields(RunOptions))}
    assert {"method", "prompt_prune_rate", "max_steps"} <= flags
    stale = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        if doc.name == "FLAGS.md":  # the removed flags' own paragraph
            text = re.sub(r"\nRemoved, each fixed at .*?\n\n", "\n", text, flags=re.S)
        stale += [
            f"{doc.name}: --dppo.{name}" for name in re.findall(r"--dppo\.(\w+)", text) if name not in flags
        ]
    assert not stale, sorted(set(stale))


def test_every_repository_file_a_doc_names_exists():
    """A file named in backticks (``core/history.py``, ``tests/core/test_unbiased.py``, ``scripts/x.sh``)
    exists: at the repository root, in the package, beside the doc, or in OpenRLHF (the host's files the
    docs name where DPPO plugs in). Run outputs (``runs/``, ``data/``, ``.cache/``, absolute paths) aside."""
    import importlib.util

    spec = importlib.util.find_spec("openrlhf")
    host = Path(spec.origin).parent if spec and spec.origin else None
    suffixes = "|".join(sorted(FILE_SUFFIXES - {"png"}))
    missing = []
    for doc in DOCS:
        for m in re.finditer(
            rf"`([\w./-]+/[\w.-]+\.(?:{suffixes}))(?:::\w+)?`", doc.read_text(encoding="utf-8")
        ):
            path = m.group(1)
            if path.startswith(("runs/", "data/", ".cache/", "/", "~", "report/")):
                continue
            places = [ROOT, PKG, doc.parent] + ([host] if host else [])
            if not any((base / path).exists() for base in places):
                missing.append(f"{doc.name}: {path}")
    assert not missing, missing
