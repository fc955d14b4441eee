"""docs/FLAGS.md's compatibility table cannot drift: every flag of OpenRLHF's ``train_ppo_ray`` is in a
row and every flag a row names is one; every row has a status and the evidence that status needs
(tested: an end-to-end test; refused: the check in ``cli/validate.py`` and the bad-input case that
proves it; not exercised: a reason); and every test, check and case it names exists."""

from __future__ import annotations

import ast
import functools
import re

import pytest
from cli_commands import ROOT, full_parser

TABLE = ROOT / "docs" / "FLAGS.md"
START, END = "<!-- compat-table -->", "<!-- /compat-table -->"
STATUSES = ("tested", "not exercised", "refused")
# `path.py::name` or `path.py::NAME[key]` (a key of a module-level dict literal, e.g. a bad-input case)
REF = re.compile(r"`((?:tests|openrlhf_dppo)/[\w/]+\.py)::(\w+)(?:\[([\w.-]+)\])?`")
FLAG = re.compile(r"`(--[\w.]+?(?:\.\*)?)`")


def table_rows() -> list[dict]:
    text = TABLE.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"{TABLE}: one {START} ... {END} block"
    lines = [line for line in text.split(START)[1].split(END)[0].splitlines() if line.startswith("|")]
    assert lines[0].startswith("| Feature |") and set(lines[1]) <= set("|- ")
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, line
        feature, flags, status, evidence = cells
        rows.append({
            "feature": feature, "flags": FLAG.findall(flags), "status": status,
            "refs": REF.findall(evidence), "reason": REF.sub("", evidence).strip(" ,;:"),
        })  # fmt: skip
    return rows


def openrlhf_flags() -> set[str]:
    parser = full_parser()
    names = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    return {n for n in names if not n.startswith("--dppo.")}


def covers(pattern: str, flag: str) -> bool:
    return flag.startswith(pattern[:-1]) if pattern.endswith(".*") else flag == pattern


def test_every_openrlhf_flag_is_in_a_row_and_every_flag_named_is_one():
    rows, flags = table_rows(), openrlhf_flags()
    assert len(flags) > 150  # OpenRLHF 0.11.2's parser, not an empty stand-in
    named = [p for r in rows for p in r["flags"]]
    assert all(r["flags"] for r in rows), [r["feature"] for r in rows if not r["flags"]]
    missing = sorted(f for f in flags if not any(covers(p, f) for p in named))
    assert not missing, f"OpenRLHF flags in no row of {TABLE.name}: {missing}"
    unknown = sorted(p for p in named if not any(covers(p, f) for f in flags))
    assert not unknown, f"{TABLE.name} names flags OpenRLHF does not have: {unknown}"


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: r["feature"][:40])
def test_every_row_has_a_status_and_the_evidence_it_needs(row):
    status, refs = row["status"], row["refs"]
    assert status in STATUSES, f"{row['feature']}: status {status!r}, expected one of {STATUSES}"
    if status == "tested":
        e2e = [r for r in refs if r[0].startswith("tests/e2e/") and r[1].startswith("test_")]
        assert e2e, f"{row['feature']}: tested, but no end-to-end test is named"
    elif status == "refused":
        assert any(r[0] == "openrlhf_dppo/cli/validate.py" for r in refs), f"{row['feature']}: no check"
        assert any(r[:2] == ("tests/cli/test_bad_input.py", "REFUSED") for r in refs), row["feature"]
    else:
        assert len(row["reason"]) >= 20, f"{row['feature']}: not exercised, with no reason given"


@functools.cache
def module_names(path: str) -> dict[str, ast.AST]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
    return names


ALL_REFS = sorted({ref for row in table_rows() for ref in row["refs"]})


@pytest.mark.parametrize("ref", ALL_REFS, ids=lambda r: f"{r[0]}::{r[1]}" + (f"[{r[2]}]" if r[2] else ""))
def test_every_test_check_and_case_named_exists(ref):
    path, name, key = ref
    assert (ROOT / path).is_file(), f"{path}: no such file"
    node = module_names(path).get(name)
    assert node is not None, f"{path} defines no {name}"
    if name.startswith("test_"):
        assert isinstance(node, ast.FunctionDef), f"{path}::{name} is not a test function"
        if path.startswith("tests/e2e/"):
            assert "pytest.mark.e2e" in (ROOT / path).read_text(encoding="utf-8")
    if key:
        assert isinstance(node, ast.Dict), f"{path}::{name} is not a dict literal"
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        assert key in keys, f"{path}::{name} has no case {key!r}"
