"""The benchmark record is three files: RESULTS.md (the experiments, newest first, each in one template),
ARCHIVE.md (superseded sittings) and INFRA.md (infrastructure findings). Every link into them, from them
or from the README and docs/, lands on a heading that exists; no heading cites an issue number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RECORD = [BENCH / name for name in ("RESULTS.md", "ARCHIVE.md", "INFRA.md")]
LINKING = [*RECORD, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(path: Path) -> list[str]:
    """The file's headings, code blocks left out (a '#' comment in a fenced block is no heading)."""
    out, fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.+)$", line)):
            out.append(m.group(1))
    return out


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of the file's headings: a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for h in _headings(path):
        s = _slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def _links(path: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) of every markdown link with an anchor into a benchmark record file."""
    out = []
    for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", path.read_text(encoding="utf-8")):
        file, anchor = target.split("#", 1)
        dest = (path.parent / file).resolve() if file else path
        if dest in RECORD:
            out.append((dest, anchor))
    return out


@pytest.mark.parametrize("path", LINKING, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_into_the_benchmark_record_lands_on_a_heading(path):
    anchors = {p: _anchors(p) for p in RECORD}
    bad = [f"{d.name}#{a}" for d, a in _links(path) if a not in anchors[d]]
    assert not bad, f"{path.name} links to headings that do not exist: {bad}"


@pytest.mark.parametrize("path", RECORD, ids=lambda p: p.name)
def test_no_heading_of_the_benchmark_record_cites_an_issue(path):
    bad = [h for h in _headings(path) if re.search(r"\bissues? \d+", h, re.I)]
    assert not bad, bad


def test_no_heading_is_a_bare_probe():
    """A heading says what it measured, not "A probe: ..."."""
    bad = [h for p in RECORD for h in _headings(p) if h.lower().startswith("a probe")]
    assert not bad, bad


def test_every_experiment_of_results_follows_the_template():
    """After "Current results", each experiment (## or ###, the countdown task's setup subsections aside)
    gives its question, its setup and the result in one bold line before the tables and notes."""
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    sections = re.split(r"^#{2,3} (.+)\n", text, flags=re.M)[1:]
    checked = 0
    for title, body in zip(sections[::2], sections[1::2]):
        if "**Question.**" not in body:
            continue
        checked += 1
        q, s, r = body.index("**Question.**"), body.index("**Setup.**"), body.index("\n**Result")
        assert q < s < r, title
    assert checked >= 20, checked


def test_every_archived_sitting_opens_with_what_superseded_it():
    text = (BENCH / "ARCHIVE.md").read_text(encoding="utf-8")
    sections = re.split(r"^## (.+)\n", text, flags=re.M)[1:]
    assert len(sections) >= 8, "ARCHIVE.md has fewer than four sittings"
    for title, body in zip(sections[::2], sections[1::2]):
        assert body.lstrip().startswith("> Superseded"), title
