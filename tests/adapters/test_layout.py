"""The step's reach: the files a training step goes through, and no sideways imports between adapters.

Measured on the source (an AST walk, nothing imported): from the modules a step runs in (the trainer and
the actor ranks; the async trainer in its place under ``--train.async_enable``), every ``from
openrlhf_dppo... import`` statement, lazy ones inside functions included, is followed to the module that
DEFINES each imported name (through package ``__init__`` files that only re-export it). Counted: every file
reached, except a package ``__init__`` whose body only imports, re-exports and names constants. Not walked:
the parent packages Python runs before a submodule (``adapters/__init__``: ``install``, which the CLI calls
once before any step, and the version check), unless a name is imported from them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "openrlhf_dppo"
STEP = ("adapters.trainer", "adapters.actor")  # a step of the sync trainer, to the optimizer
ASYNC = ("adapters.async_trainer", "adapters.actor")  # the same under --train.async_enable
MAX_STEP_FILES = 16  # DPPO's 14, and one core module for each peer method (core/cppo.py, core/greso.py)

# Which sibling an adapter may import, and what from it: ``step`` (the module every part shares) and the
# parts it builds or follows. Anything else (a helper of another adapter) belongs in ``step``.
SIBLINGS: dict[str, dict[str, set[str] | None]] = {
    "trainer": {
        "step": None,
        "samples_generator": {"DPPOSamplesGenerator"},  # the sync trainer builds the generator ...
        "experience_maker": {
            "DPPOExperienceMaker",
            "CPPOExperienceMaker",
            "CountingExperienceMaker",
        },  # ... the maker
        "dispatch": {"planned_balance"},  # OpenRLHF's balance_experiences for a DPPO step
    },
    "async_trainer": {
        "step": None,
        "samples_generator": {"DPPOSamplesGenerator"},  # the generator actor builds the generator
        "trainer": {"DPPOSteps"},  # the training actor runs the sync trainer's step
    },
    "experience_maker": {
        "step": None,
        "dispatch": {"build_dispatch", "forward_partitions", "mark_short_batch_rule"},  # it makes the plan
    },
    "actor": {"step": None, "dispatch": {"read_plan", "pop_short_batch_rule"}},  # the ranks follow it
    "samples_generator": {"step": None},
    "dispatch": {"step": None},
    "step": {},
}


def _modules() -> dict[str, Path]:
    """``adapters.step`` -> its file; the package itself is ``""``, a subpackage ``core``."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _own(module: str | None) -> str | None:
    """``openrlhf_dppo.core.sampling`` -> ``core.sampling``; None for anything outside the package."""
    if module == "openrlhf_dppo":
        return ""
    if module and module.startswith("openrlhf_dppo."):
        return module[len("openrlhf_dppo.") :]
    return None


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(module, name) for every import of our package in ``module`` (name None: the whole module)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(m, None) for m in (_own(a.name) for a in node.names) if m is not None]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1] + ([node.module] if node.module else [])
                source: str | None = ".".join(b for b in base if b)
            else:
                source = _own(node.module)
            if source is None:
                continue
            for alias in node.names:
                whole = f"{source}.{alias.name}".lstrip(".")
                out.append((whole, None) if whole in MODULES else (source, alias.name))
    return out


def _defined_in(module: str, name: str) -> str:
    """The module that defines ``name`` as ``module`` exposes it (a re-export followed to its source)."""
    for source, imported in _imports(module):
        if imported == name and source != module:
            return _defined_in(source, name)
    return module


def _only_reexports(module: str) -> bool:
    path = MODULES[module]
    if path.name != "__init__.py":
        return False
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.List, ast.Tuple)):
            continue  # __all__, __version__
        return False
    return True


def reach(starts: tuple[str, ...]) -> set[str]:
    """The modules a step starting in ``starts`` reads code from."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if _only_reexports(module):
            continue  # reached for a constant it names; what it re-exports is reached by name
        for source, name in _imports(module):
            todo.append(source if name is None else _defined_in(source, name))
    return seen


def counted(modules: set[str]) -> list[str]:
    return sorted(MODULES[m].relative_to(PKG.parent).as_posix() for m in modules if not _only_reexports(m))


def test_a_step_goes_through_at_most_16_of_our_files():
    files = counted(reach(STEP))
    assert len(files) <= MAX_STEP_FILES, f"{len(files)} files:\n" + "\n".join(files)
    assert "openrlhf_dppo/adapters/step.py" in files and "openrlhf_dppo/core/sampling.py" in files


def test_the_async_step_adds_only_the_async_trainer():
    extra = set(counted(reach(ASYNC))) - set(counted(reach(STEP)))
    assert extra == {"openrlhf_dppo/adapters/async_trainer.py"}, sorted(extra)


def test_no_adapter_imports_another_adapters_helpers():
    adapters = {m.split(".")[1] for m in MODULES if m.startswith("adapters.")}
    assert adapters == set(SIBLINGS), f"adapters on disk {sorted(adapters)}, rules for {sorted(SIBLINGS)}"
    bad = []
    for adapter, allowed in SIBLINGS.items():
        for source, name in _imports(f"adapters.{adapter}"):
            sibling = source.split(".")[1] if source.startswith("adapters.") else None
            if sibling is None or sibling == adapter:
                continue
            names = allowed.get(sibling, set())
            if sibling not in allowed or (names is not None and name not in names):
                bad.append(f"adapters/{adapter}.py imports {name or 'the module'} from adapters/{sibling}.py")
    assert not bad, "\n".join(bad)


def test_the_walk_follows_a_reexport_to_its_source_and_counts_no_reexporting_init():
    assert _defined_in("core", "prune_prompts") == "core.sampling"
    assert _defined_in("", "__version__") == ""
    assert _only_reexports("core") and _only_reexports("") and not _only_reexports("adapters")
    assert "core.sampling" in reach(("adapters.samples_generator",))
    assert "core.packing" not in reach(("adapters.samples_generator",))
