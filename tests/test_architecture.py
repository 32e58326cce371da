"""The import contract covers the whole agent: every module of `harness/` but the command line
sits in the contract's `harness` layer (pyproject.toml, `[tool.importlinter]`).

Why a test: the layer lists the agent's modules one by one (the command line lives inside
`harness/` but stands above `eval/`), so a new module left off the list would escape the check
without anyone noticing.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return [name.strip() for layer in layers for name in layer.replace("|", ":").split(":")]


def test_every_agent_module_is_in_the_contract():
    harness = ROOT / "harness"
    children = {f"harness.{p.stem}" for p in harness.glob("*.py") if p.stem != "__init__"}
    children |= {f"harness.{p.name}" for p in harness.iterdir()
                 if p.is_dir() and (p / "__init__.py").exists()}
    listed = set(_contract_layers())
    assert children - listed == set(), "add these to the harness layer in pyproject.toml"
    assert listed & children == children and "harness.cli" in listed


def test_every_package_is_in_the_contract():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    tops = {name.split(".")[0] for name in _contract_layers()}
    assert packages - tops == set(), "add these packages to the import contract"
