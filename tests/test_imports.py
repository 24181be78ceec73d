"""An import inside a function says why it is not at the module top: a ``# lazy: <reason>`` comment on its line
(an optional dependency, a cloud picked at run time, a cycle, a start-up time measured to matter, a test that
replaces the attribute). An import right after a reasoned one, in the same block, shares its reason."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("trainer", "infra")
REASON = re.compile(r"#\s*lazy:\s*\S")
IMPORTS = (ast.Import, ast.ImportFrom)


def bare_imports(root: Path, packages: tuple[str, ...], skipped: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """``path:line`` of each function-level import without a reason."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name in skipped:
                continue
            lines = path.read_text().splitlines()
            tree = ast.parse("\n".join(lines), name)

            def reasoned(node: ast.stmt) -> bool:
                return any(REASON.search(lines[n - 1]) for n in range(node.lineno, node.end_lineno + 1))

            def visit(block: list[ast.stmt], in_function: bool) -> None:
                previous_ok = False
                for node in block:
                    if isinstance(node, IMPORTS):
                        ok = reasoned(node) or previous_ok
                        if in_function and not ok:
                            found.append(f"{name}:{node.lineno}")
                        previous_ok = ok
                        continue
                    previous_ok = False
                    inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                        children = getattr(node, field, None) or []
                        visit([c for c in children if isinstance(c, ast.stmt)], inner)
                        for child in children:  # an except handler or a match case holds a block of its own
                            if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                                visit(child.body, inner)

            visit(tree.body, False)
    return found


def test_every_function_level_import_says_why_it_is_not_at_the_top():
    assert bare_imports(ROOT, PACKAGES) == []


def test_a_bare_function_level_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "import os\n"
        "if os.name:\n"
        "    import sys\n"                               # module level: no reason needed
        "def f():\n"
        "    import json  # lazy: a reason\n"
        "    import csv\n"                               # shares the reason of the import just above
        "    x = 1\n"
        "    import re\n"                                # bare: code stands between it and the one above
        "    try:\n"
        "        from pkg import (\n"
        "            b)  # lazy: on its last line\n"
        "    except ImportError:\n"
        "        import glob\n"                          # bare, in a handler
        "class C:\n"
        "    def m(self):\n"
        "        def g():\n"
        "            import io\n"                        # bare, in a nested function
        "        return g\n")
    (pkg / "skipped.py").write_text("def f():\n    import json\n")
    assert bare_imports(tmp_path, ("pkg",), {"pkg/skipped.py"}) == ["pkg/a.py:8", "pkg/a.py:13", "pkg/a.py:17"]
    (pkg / "a.py").write_text("def f():\n    import json  # lazy:\n")  # a reason is more than the word
    assert bare_imports(tmp_path, ("pkg",), {"pkg/skipped.py"}) == ["pkg/a.py:2"]
