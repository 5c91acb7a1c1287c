"""Rooms stay small: a module past ~600 lines or a function past 80 is a sign it holds more than one job (the seams
chunk.py, the clustermgr's commands and the two apps were split on). Production code only; tests may run long."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("blobstore", "blobstore_server", "bench", "deploy")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    long = {str(path.relative_to(ROOT)): lines for path in _modules()
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = {f"{path.relative_to(ROOT)}:{node.lineno} {node.name}": length
            for path in _modules() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES}
    assert long == {}
