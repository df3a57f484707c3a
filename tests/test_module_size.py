"""No module of llmserve/ is over 400 lines: one concept per module (STYLE.md)."""

from __future__ import annotations

from pathlib import Path

import llmserve

MAX_LINES = 400


def too_long(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every ``.py`` file under ``root`` over ``limit`` lines, by path, with its count."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        with path.open("rb") as f:
            n = sum(1 for _ in f)
        if n > limit:
            out[str(path.relative_to(root.parent))] = n
    return out


def test_the_checker_counts_lines_as_wc_does(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (pkg / "exact.py").write_text("x = 1\n" * MAX_LINES)
    assert too_long(pkg) == {"pkg/sub/long.py": MAX_LINES + 1}


def test_no_module_of_llmserve_is_over_400_lines():
    assert too_long(Path(llmserve.__file__).parent) == {}
