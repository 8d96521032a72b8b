"""Small rooms (issue 22): no module of the product over 500 lines, no function over 80 — a file or a function that
outgrows them is split by what it holds, not left to grow. Migrations are generated and exempt.

The product is every package the project ships (issue 38: the gateway and the SDK were left out): the server's, as
its pyproject.toml has setuptools find them, and the Python SDK's, as clients/python/pyproject.toml lists them."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDK = ROOT / "clients" / "python"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _shipped() -> list[Path]:
    """The top-level package folders the two distributions ship."""
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = [
        path
        for path in sorted(ROOT.iterdir())
        if (path / "__init__.py").exists()
        and any(fnmatch.fnmatch(path.name, pattern) for pattern in server["include"])
    ]
    sdk = tomllib.loads((SDK / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    return found + [SDK / name for name in sdk]


def _modules() -> list[Path]:
    return [
        path
        for package in _shipped()
        for path in sorted(package.rglob("*.py"))
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
    names = {path.name for path in _shipped()}
    assert {"claims", "oncall", "rollout", "gateway", "controlplane", "claim_client"} <= names
    assert len(_modules()) > 80  # a wrong root or pattern would make the two checks above pass on nothing
