"""The Docker engine as the harness's tools see it: one shared client, and its failures.

Every container the harness starts (bash sandboxes, grading containers, task images) goes
through one docker SDK client per process, so that many programs share a large connection
pool instead of each opening its own.  When the engine itself fails under a tool (it stops
answering or restarts, a container is removed under a running command), the tool must not
return that as an observation for the model: ``engine_failure`` turns such an exception into
a ``SandboxError`` that names what broke, so the program ends and the run keeps its task for
``--resume``.

The docker SDK is imported inside the functions: it costs about 0.1 s at start-up, and runs
without a sandbox never need it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from harness.tools.base import SandboxError
from harness.tools.sandbox_image import SandboxImageError

_shared_client: Any = None
_shared_lock = threading.Lock()


def shared_client() -> Any:
    """One docker SDK client for all tools of this process (a larger connection pool).

    Raises SandboxImageError, with what to do about it, when no engine answers.
    """
    global _shared_client
    with _shared_lock:
        if _shared_client is None:
            try:
                import docker  # type: ignore[import-untyped]  # docker SDK: start-up cost

                client = docker.from_env(version="auto", timeout=120, max_pool_size=64)
                client.ping()
            except Exception as exc:
                raise SandboxImageError(
                    f"no Docker engine answers ({exc}). Start one with "
                    "`sudo scripts/docker_engine.sh`, or start your Docker daemon and "
                    "make sure this user may use its socket."
                ) from exc
            _shared_client = client
        return _shared_client


def engine_failure(exc: BaseException, doing: str) -> SandboxError | None:
    """A ``SandboxError`` saying what broke when ``exc`` is the Docker engine failing under
    ``doing`` (it stopped answering or restarted, a container is gone); None for anything
    else (then it is the caller's own error)."""
    import docker.errors  # type: ignore[import-untyped]  # docker SDK: start-up cost
    import requests  # with the docker SDK, which uses it

    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return SandboxError(f"the Docker engine stopped answering while {doing} "
                            f"({type(exc).__name__}: {exc}); was it restarted or stopped?")
    if isinstance(exc, docker.errors.NotFound):
        return SandboxError(f"the container was gone while {doing} ({exc.explanation or exc}): "
                            "it was removed outside the harness, or the Docker engine lost it")
    if isinstance(exc, docker.errors.APIError) and (exc.status_code or 0) >= 500:
        return SandboxError(f"the Docker engine failed while {doing}: {exc}")
    return None


@contextlib.contextmanager
def engine_failures(doing: str) -> Iterator[None]:
    """Raise the Docker engine failing inside the block as ``engine_failure``'s
    ``SandboxError``; any other exception passes through unchanged."""
    try:
        yield
    except Exception as exc:
        failure = engine_failure(exc, doing)
        if failure is None or failure is exc:
            raise
        raise failure from exc
