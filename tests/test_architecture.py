"""Every package of the project stands on a floor of the import contract (pyproject.toml,
`[tool.importlinter]`, checked by `lint-imports` in `.ci/run`).

Why a test: the contract names the packages one by one, so a new package left off the list
would escape the check without anyone noticing.
"""

from __future__ import annotations

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
