"""No module of the package is over 400 lines (the developers' guide: a module a reader can hold).

Not collected yet (no ``test_`` prefix) while other modules are being split; enable it by renaming
this file to ``test_module_size.py``. ``pytest tests/foundation/module_size_check.py`` runs it now.
"""

from pathlib import Path

MAX_LINES = 400
PKG = Path(__file__).resolve().parents[2] / "openrlhf_dppo"


def test_no_module_of_the_package_is_over_400_lines():
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(PKG.rglob("*.py"))}
    assert len(sizes) > 20, f"found only {len(sizes)} modules under {PKG}"
    over = [f"{p.relative_to(PKG.parent)}: {n} lines" for p, n in sizes.items() if n > MAX_LINES]
    assert not over, f"modules over {MAX_LINES} lines (split them by job):\n" + "\n".join(over)
