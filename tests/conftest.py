"""Shared pytest fixtures.

server: a `harness serve --policy continuum` (emulated GPU) shared by a test module; a module
that needs other server options defines its own `server`.

docker_client: a docker SDK client for the local engine.  When no engine
answers, tests that use it are skipped, unless HARNESS_REQUIRE_DOCKER=1 (set
in CI), where a silent skip would hide a broken sandbox, so they fail.
"""

from __future__ import annotations

import os
from typing import Any

import pytest


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
