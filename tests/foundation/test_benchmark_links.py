"""The benchmark record is three files: RESULTS.md (the current results and one section per open question,
each in one template), ARCHIVE.md (every other sitting) and INFRA.md (infrastructure findings). Every link
into them, from anywhere in the repository, lands on a heading that exists; no heading cites an issue
number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RECORD = [BENCH / name for name in ("RESULTS.md", "ARCHIVE.md", "INFRA.md")]
LINKING = [*RECORD, ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# files outside the markdown docs that may name a section of the record (code comments, docstrings, scripts)
OTHER = sorted(
    p
    for folder in (
        "openrlhf_dppo",
        "tests",
        "benchmarks",
        "examples",
        "scripts",
        "configs",
        "research",
        "slurm",
    )
    for p in (ROOT / folder).rglob("*")
    if p.suffix in {".py", ".sh", ".yaml", ".sbatch", ".md"}
    and p not in RECORD
    and p != Path(__file__).resolve()
    and ".venv" not in p.parts
)


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


def test_every_reference_to_a_section_of_the_record_in_code_and_scripts_exists():
    """``RESULTS.md#anchor`` written in a comment, docstring or script (not a markdown link) lands too."""
    anchors = {p.name: _anchors(p) for p in RECORD}
    bad = []
    for path in OTHER:
        for name, anchor in re.findall(
            r"\b(RESULTS|ARCHIVE|INFRA)\.md#([\w-]+)", path.read_text(errors="ignore")
        ):
            if anchor not in anchors[f"{name}.md"]:
                bad.append(f"{path.relative_to(ROOT)}: {name}.md#{anchor}")
    assert not bad, bad


@pytest.mark.parametrize("path", RECORD, ids=lambda p: p.name)
def test_no_heading_of_the_benchmark_record_cites_an_issue(path):
    bad = [h for h in _headings(path) if re.search(r"\bissues? \d+", h, re.I)]
    assert not bad, bad


def test_no_heading_is_a_bare_probe():
    """A heading says what it measured, not "A probe: ..."."""
    bad = [h for p in RECORD for h in _headings(p) if h.lower().startswith("a probe")]
    assert not bad, bad


def test_every_section_of_results_follows_the_template():
    """After "Current results" and "How to read this page", each section (one open question) gives its
    question, its setup and the result in one bold line, in that order, before its table."""
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    sections = re.split(r"^## (.+)\n", text, flags=re.M)[1:]
    intro = ("Current results", "How to read this page")
    checked = 0
    for title, body in zip(sections[::2], sections[1::2]):
        if title.startswith(intro):
            continue
        checked += 1
        assert "**Question.**" in body and "**Setup.**" in body and "\n**Result" in body, title
        q, s, r = body.index("**Question.**"), body.index("**Setup.**"), body.index("\n**Result")
        assert q < s < r and "\n|---" in body[r:], title
    assert checked >= 5, checked


def test_every_archived_sitting_opens_with_why_it_is_there():
    """Each sitting of ARCHIVE.md opens with a quoted note: what superseded it, or where its summary stands."""
    text = (BENCH / "ARCHIVE.md").read_text(encoding="utf-8")
    sections = re.split(r"^## (.+)\n", text, flags=re.M)[1:]
    assert len(sections) >= 8, "ARCHIVE.md has fewer than four sittings"
    for title, body in zip(sections[::2], sections[1::2]):
        assert body.lstrip().startswith("> "), title
