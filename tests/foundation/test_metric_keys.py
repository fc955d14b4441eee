"""Every metric key is named in one module, ``openrlhf_dppo/metric_keys.py``; the run directory's file
names in ``openrlhf_dppo/run_dir.py``. Anywhere else in the package, the benchmarks and the scripts a key
is written as a name from there, never as a quoted string: a literal ``"dppo/weight_ess"`` elsewhere is
a second spelling that can drift (a renamed key that one reader still looks up under its old name).

The scan reads every string constant of the source (f-strings included, their placeholders as ``{}``)
except docstrings, which may name keys in prose."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from openrlhf_dppo import metric_keys, run_dir

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("openrlhf_dppo", "benchmarks", "scripts", "examples")
KEYS_MODULE = REPO / "openrlhf_dppo" / "metric_keys.py"
RUN_DIR_MODULE = REPO / "openrlhf_dppo" / "run_dir.py"

# the prefixes of every key the trainer logs (OpenRLHF's rollout/* and timing/*, the writer's time/*,
# DPPO's dppo/* and the accounting keys): a string that is such a prefix + "/" + a name is a key
KEY_VALUES = {v for k, v in vars(metric_keys).items() if k.isupper() and isinstance(v, str)}
PREFIXES = sorted({v.split("/")[0] for v in KEY_VALUES if "/" in v})
KEY_LIKE = re.compile(rf"({'|'.join(PREFIXES)})/[\w{{}}.\-]*")
# keys without a slash are caught by their exact value
EXACT_KEYS = {v for v in KEY_VALUES if "_" in v and "/" not in v and len(v) > 6}
RUN_DIR_FILES = {run_dir.RUN_CONFIG, run_dir.METRICS, run_dir.STATUS, run_dir.EVAL_RESULTS}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (the first statement of a module/class/def)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant and f-string (placeholders as ``{}``) but docstrings."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    inside_fstring = set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            inside_fstring.update(id(v) for v in node.values)
            out.append((node.lineno, text))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip | inside_fstring
        ):
            out.append((node.lineno, node.value))
    return out


def literal_keys(source: str, *, keys: bool = True, files: bool = False) -> list[tuple[int, str]]:
    """The metric keys (``keys``) and run-directory file names (``files``) spelled as literals."""
    found = []
    for line, text in _strings(source):
        if keys and (KEY_LIKE.fullmatch(text) or text in EXACT_KEYS):
            found.append((line, text))
        elif files and text in RUN_DIR_FILES:
            found.append((line, text))
    return sorted(found)


def _sources() -> list[Path]:
    return sorted(p for d in SCANNED if (REPO / d).is_dir() for p in (REPO / d).rglob("*.py"))


def test_no_metric_key_is_spelled_outside_the_keys_module():
    bad = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in _sources()
        if path != KEYS_MODULE
        for line, text in literal_keys(path.read_text(), files=path != RUN_DIR_MODULE)
    ]
    assert not bad, (
        "metric keys (or run-directory file names) written as literals; use the names of "
        "openrlhf_dppo/metric_keys.py (file names: openrlhf_dppo/run_dir.py):\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "snippet,found",
    [
        ('m["dppo/weight_ess"] = 1.0', [(1, "dppo/weight_ess")]),  # a known key
        ('x = "rollout/some_new_key"', [(1, "rollout/some_new_key")]),  # a key not named yet
        ('level = "prompt"\nk = f"dppo/{level}_keep_frac"', [(2, "dppo/{}_keep_frac")]),  # built
        ('r.get("timing/step_total")', [(1, "timing/step_total")]),
        ('r.get("eval_num_samples")', [(1, "eval_num_samples")]),  # an exact key without a slash
        ('path = os.path.join(d, "eval_results.json")', [(1, "eval_results.json")]),  # a file name
        ('"""Logs ``dppo/weight_ess`` per step."""\nx = 1', []),  # prose in a docstring
        ('print("see dppo/weight_ess and timing/*")', []),  # a message, not a key
        ('path = "data/math"', []),  # a path, not a key
    ],
)
def test_the_scan_finds_a_planted_literal_key(snippet, found):
    assert literal_keys(snippet, files=True) == found


def test_the_scan_would_fail_on_the_tree_with_one_literal_planted(tmp_path):
    # the real scan over a copy of one module with the name replaced by its literal: found at once
    src = (REPO / "openrlhf_dppo" / "core" / "estimator.py").read_text()
    assert literal_keys(src) == []
    planted = src.replace("{NORMALIZER: z}", '{"dppo/normalizer": z}')
    assert planted != src
    assert [text for _, text in literal_keys(planted)] == ["dppo/normalizer"]
