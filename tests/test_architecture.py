"""Every package of the project stands on a floor of the import contract (pyproject.toml,
`[tool.importlinter]`, checked by `lint-imports` in `.ci/run`).

Why a test: the contract names the packages one by one, so a new package left off the list
would escape the check without anyone noticing.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_every_package_is_on_a_floor_of_the_contract():
    config = _config()
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(layers) == set(config["root_packages"]), \
        "list every top-level package in [tool.importlinter] (root_packages and the layers)"


def test_every_package_is_installed():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    included = {name.rstrip("*") for name in setuptools["packages"]["find"]["include"]}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages <= included, "add the package to [tool.setuptools.packages.find]"


MAX_LINES = 600  # docs/architecture.md: a module has one job and stays under about this


def _modules() -> dict[str, Path]:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    return {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
            for package in packages for f in (ROOT / package).rglob("*.py")}


def test_no_module_is_over_the_size_limit():
    over = {name: n for name, f in _modules().items()
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not over, f"split these modules (over {MAX_LINES} lines): {over}"


def test_no_two_modules_import_each_other_even_through_others():
    """`lint-imports` keeps the packages' arrows pointing down; inside a package, a cycle of
    modules (an import inside a function counts: it is never there to dodge a cycle) would
    still be a knot nobody can read from one end."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, f in modules.items():
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            graph[name].update(t for t in targets if t in modules and t != name)
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, f"module import cycles: {cycles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, iteratively (the graph has ~400 nodes)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found
