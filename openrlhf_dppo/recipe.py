"""Experiment recipes: YAML files expanded into the command line of a training entry point (the shell
scripts, the Slurm launcher and ``--config`` all expand them here). Format: docs/SLURM.md, "Your own
flags: a recipe".

    python -m openrlhf_dppo.recipe RECIPE.yaml [--dry-run] [more flags]   runs (or prints) the command

    base: other.yaml                          # optional: start from this recipe (relative to this file)
    entry: openrlhf_dppo.cli.train_dppo_ray   # module run with `python -m` (the default)
    vars: {NNODES: 1, OUTPUT_DIR: "${REPO_ROOT}/runs/x"}   # the environment variable NAME wins
    args:                                     # flag name without "--"; nested mappings join with "."
      actor: {model_name_or_path: "${MODEL}", gradient_checkpointing_enable: true}  # false/null: left out
      eval.dataset: [a.jsonl, b.jsonl]        # a list: one value per item
"""

import ast
import operator
import os
import re
import sys

import yaml

DEFAULT_ENTRY = "openrlhf_dppo.cli.train_dppo_ray"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_ARITH = re.compile(r"\$\(\((.*?)\)\)")
# bash arithmetic is integer arithmetic: "/" divides and rounds down
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv}


class ConfigError(ValueError):
    """A config that cannot be expanded; the message names the file and the key."""


def _arith(expr: str, scope: dict, where: str) -> str:
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            try:
                return int(scope[node.id])
            except (KeyError, ValueError):
                raise ConfigError(f"{where}: $(({expr})): {node.id} is not a defined integer") from None
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ConfigError(f"{where}: $(({expr})): only integers, names and + - * / are allowed")

    try:
        return str(ev(ast.parse(expr, mode="eval")))
    except SyntaxError:
        raise ConfigError(f"{where}: $(({expr})) is not an arithmetic expression") from None


def substitute(text: str, scope: dict, where: str = "config") -> str:
    """Expand ``${NAME}``, ``${NAME:-default}`` and ``$((...))`` in ``text`` from ``scope``."""

    def var(m):
        name, default = m.group(1), m.group(2)
        if name in scope and scope[name] != "":
            return str(scope[name])
        if default is not None:
            return substitute(default, scope, where)
        raise ConfigError(f"{where}: ${{{name}}} is not defined (set it in vars: or in the environment)")

    text = _VAR.sub(var, text)
    return _ARITH.sub(lambda m: _arith(m.group(1), scope, where), text)


def _flatten(args: dict, prefix: str = "") -> list:
    items = []
    for key, value in args.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            items += _flatten(value, name)
        else:
            items.append((name, value))
    return items


def _read(path: str, _chain: tuple = ()) -> dict:
    """The recipe at ``path`` with its ``base`` chain merged: ``{"entry", "vars", "args"}`` where vars
    and args map a name to ``(value, file it was set in)``, in order."""
    real = os.path.realpath(path)
    if real in _chain:
        cycle = " -> ".join([*_chain, real])
        raise ConfigError(f"{path}: base: the recipes name each other in a cycle ({cycle})")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with base, entry, vars and args at the top level")
    unknown = set(data) - {"base", "entry", "vars", "args"}
    if unknown:
        raise ConfigError(f"{path}: the top level takes base, entry, vars and args; found {sorted(unknown)}")
    merged = {"entry": None, "vars": {}, "args": {}}
    if data.get("base") is not None:
        base = os.path.join(os.path.dirname(os.path.abspath(path)), str(data["base"]))
        merged = _read(base, (*_chain, real))
    for section in ("vars", "args"):
        if not isinstance(data.get(section) or {}, dict):
            raise ConfigError(f"{path}: {section} must be a mapping")
    merged["vars"].update({name: (value, path) for name, value in (data.get("vars") or {}).items()})
    merged["args"].update({name: (value, path) for name, value in _flatten(data.get("args") or {})})
    merged["entry"] = data.get("entry") or merged["entry"]
    return merged


def _scope(recipe: dict, environ) -> dict:
    env = dict(os.environ if environ is None else environ)
    scope = {"REPO_ROOT": env.get("REPO_ROOT") or REPO_ROOT}
    for name, (default, where) in recipe["vars"].items():
        if env.get(name):
            scope[name] = env[name]
        else:
            scope[name] = substitute(str(default), scope, f"{where}: vars.{name}")
    return scope


def resolve_vars(path: str, environ=None) -> dict:
    """The recipe's variables after substitution (environment first, then the files' defaults)."""
    return _scope(_read(path), environ)


def load_config(path: str, environ=None) -> list[str]:
    """The flags of the recipe at ``path`` (format: docs/SLURM.md, "Your own flags: a recipe")."""
    recipe = _read(path)
    scope = _scope(recipe, environ)
    argv = []
    for name, (value, where) in recipe["args"].items():
        where = f"{where}: args.{name}"
        if value is True:
            argv.append(f"--{name}")
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [f"--{name}", *(substitute(str(v), scope, where) for v in value)]
        else:
            argv += [f"--{name}", substitute(str(value), scope, where)]
    return argv


def load_command(path: str, environ=None) -> list[str]:
    """``[python, "-m", entry, *load_config(path)]``."""
    entry = _read(path)["entry"] or DEFAULT_ENTRY
    return [sys.executable, "-m", entry, *load_config(path, environ)]


def expand_argv(argv, environ=None) -> list[str]:
    """``argv`` with each ``--config PATH`` (or ``--config=PATH``) replaced by the flags of PATH."""
    out, i, argv = [], 0, list(argv)
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a YAML path")
            out += load_config(argv[i + 1], environ)
            i += 2
            continue
        if arg.startswith("--config="):
            out += load_config(arg.split("=", 1)[1], environ)
        else:
            out.append(arg)
        i += 1
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path, rest = argv[0], argv[1:]
    dry = "--dry-run" in rest
    rest = [a for a in rest if a != "--dry-run"]
    try:
        cmd = load_command(path) + rest
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if dry:
        import shlex

        print(shlex.join(cmd))
        return 0
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
