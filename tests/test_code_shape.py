"""Small rooms (issue 22): no module of the product over 500 lines, no function over 80 — a file or a function that
outgrows them is split by what it holds, not left to grow. Migrations are generated and exempt."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("claims", "oncall", "rollout", "controlplane")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }

    assert long == {}


def test_no_function_is_over_80_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines

    assert long == {}


def test_the_check_sees_the_product():
    assert len(_modules()) > 80  # a wrong root or pattern would make the two checks above pass on nothing
