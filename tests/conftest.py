"""Shared pytest fixtures, and the check that markers say what a test needs.

server: a `harness serve --policy continuum` (emulated GPU) shared by a test module; a module
that needs other server options defines its own `server`.

docker_client: a docker SDK client for the local engine.  When no engine
answers, tests that use it are skipped, unless HARNESS_REQUIRE_DOCKER=1 (set
in CI), where a silent skip would hide a broken sandbox, so they fail.

autoclose: `autoclose(engine)` returns the engine (a `VirtualEngine`, a `VirtualCluster`, a
`tests/vllm_driver.py` driver: anything with `close()`) and closes it when the test ends, pass
or fail, the last one first (each engine restores the process clock it found). A helper that a
module-scoped fixture calls closes its engine itself (`contextlib.closing`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

# the marker check (tests/marker_check.py) is a plugin: its hooks watch every test
pytest_plugins = ("marker_check",)

Closable = TypeVar("Closable")


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """Return a connected docker SDK client, or skip / fail (see module docstring)."""
    required = os.environ.get("HARNESS_REQUIRE_DOCKER") == "1"
    try:
        import docker

        client = docker.from_env(version="auto", timeout=60)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - ImportError, DockerException, connection errors
        msg = (
            f"no Docker engine reachable ({type(exc).__name__}: {exc}); "
            "start one with `sudo scripts/docker_engine.sh`"
        )
        if required:
            pytest.fail(f"HARNESS_REQUIRE_DOCKER=1 but {msg}", pytrace=False)
        pytest.skip(msg)
    yield client
    client.close()


@pytest.fixture(scope="module")
def server() -> Any:
    """A `harness serve --policy continuum` process for the module's tests."""
    from harness.server_process import ServerProcess

    with ServerProcess(policy="continuum") as s:
        yield s


@pytest.fixture
def autoclose() -> Iterator[Callable[[Closable], Closable]]:
    """`autoclose(engine)` -> engine, closed at the test's end (see module docstring)."""
    opened: list[Any] = []

    def register(thing: Closable) -> Closable:
        opened.append(thing)
        return thing

    yield register
    for thing in reversed(opened):
        thing.close()
