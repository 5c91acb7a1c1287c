"""The import rules the layout promises, read from the source (every import, also the lazy and type-only
ones): the SDK imports nothing of the server, a service or a Spark job reaches another service only through its
client.py (the API models are in libs/proto and the SDK's records), nothing below imports upward (libs/rpc, below
the services' contracts in libs/proto, included), and no modules import each other in a circle."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("blobstore", "blobstore_server")
# pyproject's `dependencies`, as modules: all `pip install blobstore` brings
SDK_THIRD_PARTY = {re.split(r"[<>=!~ \[;]", requirement)[0].replace("-", "_")
                   for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, as written (relative imports resolved)."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            named = {f"{base}.{alias.name}" for alias in node.names}
            submodules = {m for m in named if _is_module(m)}  # `from pkg import module` imports the module
            found.update(submodules if submodules == named else {base, *submodules})
    return found


MODULES = {_module(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}
GRAPH = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}
THIRD_PARTY = {name: {m.split(".")[0] for m in _imports(path)} - {"blobstore", "blobstore_server", "__future__"}
               for name, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] == "blobstore" else ".".join(parts[:2])


# each may import only those before it (and itself): the CLI drives the cluster code, never the other way round
LAYERS = ["blobstore", "blobstore_server", "blobstore_server.libs", "blobstore_server.services",
          "blobstore_server.spark", "blobstore_server.cluster", "blobstore_server.cli"]


def test_the_sdk_imports_only_itself_and_its_declared_dependencies() -> None:
    sdk = [m for m in MODULES if _layer(m) == "blobstore"]
    assert sdk
    for module in sdk:
        assert all(_layer(m) == "blobstore" for m in GRAPH[module]), module
        assert THIRD_PARTY[module] <= SDK_THIRD_PARTY | sys.stdlib_module_names, (module, THIRD_PARTY[module])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_nothing_imports_upward(module: str) -> None:
    allowed = LAYERS[:LAYERS.index(_layer(module)) + 1]
    assert {m for m in GRAPH[module] if _layer(m) not in allowed} == set()


# within libs: a package and what it must not import. libs/rpc serves and calls the routes each service hands it
# (its `RouteTable`), so it knows no service's contract (libs/proto) and no service.
BELOW = {"blobstore_server.libs.rpc": ("blobstore_server.libs.proto", "blobstore_server.services")}


@pytest.mark.parametrize("package", sorted(BELOW))
def test_nothing_in_libs_imports_a_layer_above_it(package: str) -> None:
    inside = [m for m in MODULES if m == package or m.startswith(f"{package}.")]
    assert inside
    upward = {m: sorted(i for i in GRAPH[m] if i.startswith(BELOW[package])) for m in inside}
    assert {m: found for m, found in upward.items() if found} == {}


def _service(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["blobstore_server", "services"] and len(parts) > 2 else None


def test_services_and_jobs_reach_a_service_only_through_its_client() -> None:
    """A service imports only its own modules and other services' client.py; the Spark jobs only clients."""
    crossing = {}
    for module, imported in GRAPH.items():
        if _layer(module) not in ("blobstore_server.services", "blobstore_server.spark"):
            continue
        crossing[module] = sorted(m for m in imported if _service(m) not in (None, _service(module))
                                  and m.split(".")[3:] not in (["client"], []))
    assert {m: c for m, c in crossing.items() if c} == {}


def test_no_modules_import_each_other_in_a_circle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert circles == []
