"""Build (or pull) the Docker image the bash tool runs agent commands in.

Why this module exists: agent commands must run isolated, with no network
(`docker run --network none`), as a non-root user, with Python, pytest and git
available.  The machines this project is developed on reach no container
registry, so the image cannot come from Docker Hub: we build it offline with
``debootstrap`` from the Debian archive (which *is* reachable, like any
package registry) and turn the root filesystem into an image with
``docker import``.  Users who have a network can instead derive the image
from a pulled base image (:func:`pull_or_build`); both paths give an image
with the same contract:

* user ``agent`` (uid 1000, gid 1000, home ``/home/agent``) exists;
* ``/testbed`` exists and is owned by ``agent``;
* ``python3``, ``python3 -m pytest``, ``git`` work;
* label ``harness.sandbox=1``; working directory ``/home/agent``.

The image metadata keeps ``root`` as the default user, so that setup steps
(copying a repository into ``/testbed``, fixing ownership) can still run as
root; the bash tool passes ``user="agent"`` for every agent command.

Usage (`cli.sandbox`)::

    harness sandbox build [--force] [--name NAME]

Building needs root (debootstrap), ``debootstrap`` itself and a running Docker
engine; ``scripts/docker_engine.sh`` provides the last two on Debian.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

DEFAULT_IMAGE = "harness-sandbox:bookworm"
DEFAULT_SUITE = "bookworm"
DEFAULT_PACKAGES: tuple[str, ...] = (
    "python3",
    "python3-pytest",
    "git",
    "ca-certificates",
    "procps",
    "coreutils",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SANDBOX_LABEL = "harness.sandbox"
AGENT_USER = "agent"
AGENT_UID = 1000
AGENT_HOME = "/home/agent"
TESTBED = "/testbed"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Progress = Callable[[str], Any]


class SandboxImageError(RuntimeError):
    """The sandbox image could not be found, pulled or built.

    The message always says what the user can do about it (install a tool,
    start the engine, run as root), because this error usually reaches a
    person running the harness for the first time.
    """


# --------------------------------------------------------------------------
# Docker helpers
# --------------------------------------------------------------------------


def docker_client(timeout: int = 60) -> Any:
    """Return a docker SDK client for the local engine, or raise SandboxImageError.

    The API version is negotiated ("auto") because the Debian engine
    (docker.io 20.10, API 1.41) is older than what recent SDKs default to.
    """
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SandboxImageError(
            "the 'docker' Python package is missing: pip install docker"
        ) from exc
    try:
        client = docker.from_env(version="auto", timeout=timeout)
        client.ping()
    except Exception as exc:
        raise SandboxImageError(
            f"no Docker engine answers ({exc}). Start one with "
            "`sudo scripts/docker_engine.sh` (installs docker.io on Debian and starts "
            "dockerd), or start your Docker daemon and make sure this user may use "
            "its socket (e.g. `sudo usermod -aG docker $USER`)."
        ) from exc
    return client


def image_exists(client: Any, name: str) -> bool:
    """True when the engine behind ``client`` has an image called ``name``."""
    import docker.errors  # type: ignore[import-untyped]

    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


# --------------------------------------------------------------------------
# Offline build: debootstrap + docker import
# --------------------------------------------------------------------------


def _mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` (deepest first).

    debootstrap bind-mounts /dev, /proc, /sys into the target while it works
    and unmounts them on exit, but a killed run can leave them behind.
    Deleting the rootfs with those still mounted would delete files of the
    host's /dev, so we look before we delete.
    """
    real = os.path.realpath(path)
    found: list[str] = []
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 2:
                    continue
                mnt = fields[1].encode().decode("unicode_escape")
                if mnt == real or mnt.startswith(real + os.sep):
                    found.append(mnt)
    except OSError:
        pass
    return sorted(found, key=len, reverse=True)


def _remove_rootfs(path: str, progress: Progress) -> None:
    """Delete a temporary rootfs, unmounting leftovers first; never follow mounts."""
    if not os.path.exists(path):
        return
    for mnt in _mounts_under(path):
        subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)
    left = _mounts_under(path)
    if left:
        progress(f"warning: not deleting {path}: still mounted: {', '.join(left)}")
        return
    shutil.rmtree(path, ignore_errors=True)


def _run(cmd: Sequence[str], what: str, progress: Progress | None = None) -> None:
    """Run ``cmd``; stream its output to ``progress``; raise with the output tail on failure."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        if progress is not None:
            progress(f"  {line}")
    rc = proc.wait()
    if rc != 0:
        raise SandboxImageError(
            f"{what} failed (exit {rc}): {' '.join(cmd)}\n" + "\n".join(tail)
        )


def _check_build_prerequisites() -> None:
    """Raise SandboxImageError naming the fix when a build tool or privilege is missing."""
    if shutil.which("debootstrap") is None:
        raise SandboxImageError(
            "debootstrap is not installed; it is needed to build the sandbox image "
            "offline. Install it (`sudo apt-get install debootstrap`, or run "
            "`sudo scripts/docker_engine.sh`, which installs it), or use a machine "
            "that can pull images (pull_or_build)."
        )
    if shutil.which("docker") is None:
        raise SandboxImageError(
            "the docker CLI is not installed (needed for `docker import`). "
            "Install Docker, or run `sudo scripts/docker_engine.sh` on Debian."
        )
    if os.geteuid() != 0:
        raise SandboxImageError(
            "building the sandbox image with debootstrap needs root: run "
            "`sudo .venv/bin/harness sandbox build`, or use pull_or_build "
            "on a machine with network access."
        )


def _add_agent_user(rootfs: str) -> None:
    """Create user ``agent`` (uid/gid 1000) and ``/testbed`` inside the rootfs.

    useradd from the rootfs itself (package ``passwd`` is in minbase) keeps
    /etc/passwd, /etc/group and /etc/shadow consistent; we call it through
    chroot rather than --root so that the target's own login.defs applies.
    """
    _run(
        [
            "chroot",
            rootfs,
            "useradd",
            "--create-home",
            "--home-dir",
            AGENT_HOME,
            "--uid",
            str(AGENT_UID),
            "--user-group",
            "--shell",
            "/bin/bash",
            AGENT_USER,
        ],
        "creating user agent",
    )
    testbed = os.path.join(rootfs, TESTBED.lstrip("/"))
    os.makedirs(testbed, exist_ok=True)
    os.chown(testbed, AGENT_UID, AGENT_UID)
    os.chmod(testbed, 0o755)
    os.chown(os.path.join(rootfs, AGENT_HOME.lstrip("/")), AGENT_UID, AGENT_UID)


def _slim_rootfs(rootfs: str) -> None:
    """Drop the apt caches: the .deb files alone are tens of MB and no one runs apt offline."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        d = os.path.join(rootfs, sub)
        if not os.path.isdir(d):
            continue
        for entry in os.listdir(d):
            p = os.path.join(d, entry)
            if os.path.isfile(p) and not os.path.islink(p) and entry != "lock":
                os.unlink(p)
    for f in ("var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin"):
        p = os.path.join(rootfs, f)
        if os.path.exists(p):
            os.unlink(p)


def _import_rootfs(rootfs: str, name: str, changes: Iterable[str]) -> str:
    """Stream ``tar -C rootfs -c .`` into ``docker import -``; return the image id.

    A pipe between two processes streams hundreds of MB without holding them
    in Python memory, which the SDK's import_image(data=...) would do.
    """
    import_cmd = ["docker", "import"]
    for change in changes:
        import_cmd += ["--change", change]
    import_cmd += ["-", name]
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", rootfs, "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        imp = subprocess.run(
            import_cmd, stdin=tar.stdout, capture_output=True, text=True, check=False
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar_err = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
        tar_rc = tar.wait()
    if tar_rc != 0:
        raise SandboxImageError(
            f"tar of the rootfs failed (exit {tar_rc}): {tar_err.strip()}"
        )
    if imp.returncode != 0:
        raise SandboxImageError(
            f"docker import failed (exit {imp.returncode}): {imp.stderr.strip()}. "
            "Is the engine running? Try `sudo scripts/docker_engine.sh`."
        )
    return imp.stdout.strip()


def build_offline_image(
    name: str = DEFAULT_IMAGE,
    *,
    suite: str = DEFAULT_SUITE,
    packages: Sequence[str] = DEFAULT_PACKAGES,
    force: bool = False,
    progress: Progress = print,
    mirror: str | None = None,
    client: Any = None,
) -> str:
    """Build the sandbox image ``name`` with no registry access; return its name.

    Steps: ``debootstrap --variant=minbase --include=PACKAGES SUITE ROOTFS``,
    add user ``agent`` and ``/testbed``, drop apt caches, ``docker import``
    with WORKDIR/ENV/LABEL metadata.  Returns at once when the image already
    exists (unless ``force``).  The temporary rootfs is always removed.

    ``mirror`` defaults to ``$HARNESS_DEBIAN_MIRROR`` or deb.debian.org;
    the rootfs goes under ``$HARNESS_ROOTFS_TMP`` (default: the system temp
    dir, which must allow device files and exec, i.e. no nodev/noexec).
    """
    if client is None:
        client = docker_client()
    if not force and image_exists(client, name):
        progress(f"image {name} already exists")
        return name
    _check_build_prerequisites()
    mirror = mirror or os.environ.get("HARNESS_DEBIAN_MIRROR") or DEFAULT_MIRROR
    t0 = time.monotonic()
    rootfs = tempfile.mkdtemp(
        prefix="harness-rootfs-", dir=os.environ.get("HARNESS_ROOTFS_TMP")
    )
    try:
        progress(
            f"debootstrap {suite} ({', '.join(packages)}) from {mirror} into {rootfs}"
        )
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                suite,
                rootfs,
                mirror,
            ],
            "debootstrap",
            progress,
        )
        progress("adding user agent (uid 1000) and /testbed")
        _add_agent_user(rootfs)
        _slim_rootfs(rootfs)
        progress(f"importing rootfs as {name}")
        changes = [
            f"ENV PATH={IMAGE_PATH}",
            "ENV LANG=C.UTF-8",
            "ENV PYTHONDONTWRITEBYTECODE=1",
            f"WORKDIR {AGENT_HOME}",
            f"LABEL {SANDBOX_LABEL}=1",
            f"LABEL {SANDBOX_LABEL}.suite={suite}",
            'CMD ["/bin/bash"]',
        ]
        image_id = _import_rootfs(rootfs, name, changes)
    finally:
        _remove_rootfs(rootfs, progress)
    progress(f"built {name} ({image_id}) in {time.monotonic() - t0:.0f}s")
    return name


# --------------------------------------------------------------------------
# Online path: pull a base image and derive the sandbox from it
# --------------------------------------------------------------------------

_DERIVED_DOCKERFILE = """\
FROM {base}
RUN set -eux; \\
    if ! command -v python3 >/dev/null; then NEED_PY="python3"; else NEED_PY=""; fi; \\
    apt-get update; \\
    apt-get install -y --no-install-recommends git ca-certificates procps $NEED_PY; \\
    rm -rf /var/lib/apt/lists/*; \\
    python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install --no-cache-dir pytest; \\
    id -u {user} >/dev/null 2>&1 || useradd --create-home --home-dir {home} --uid {uid} \\
        --user-group --shell /bin/bash {user}; \\
    mkdir -p {testbed}; chown {uid}:{uid} {testbed}
ENV PYTHONDONTWRITEBYTECODE=1
WORKDIR {home}
LABEL {label}=1
"""


def pull_or_build(
    name: str = DEFAULT_IMAGE,
    *,
    base: str = "python:3.11-slim",
    pull_timeout: float = 10.0,
    force: bool = False,
    progress: Progress = print,
) -> str:
    """Give the sandbox image ``name``: existing, derived from a pulled base, or built offline.

    A ``base`` already present locally is used without pulling.

    With a registry in reach, pulling ``base`` and deriving the image from a
    small Dockerfile is quicker and needs no root.  Without one (these
    machines: the engine fails DNS for registry-1.docker.io in milliseconds)
    the pull fails, and within ``pull_timeout`` seconds of silence at worst,
    because the pull runs with a socket timeout of ``pull_timeout``;
    then we fall back to :func:`build_offline_image`.
    """
    client = docker_client()
    if not force and image_exists(client, name):
        progress(f"image {name} already exists")
        return name
    repo, _, tag = (
        base.rpartition(":") if ":" in base.split("/")[-1] else (base, "", "latest")
    )
    # the docker SDK (and requests, its transport): start-up cost, only an engine call needs it
    import docker.errors  # type: ignore[import-untyped]
    import requests

    try:
        if image_exists(client, base):
            progress(f"base image {base} is present locally; not pulling")
        else:
            progress(f"pulling {base} (timeout {pull_timeout:.0f}s)")

            # Same connection as `client`, shorter socket timeout for the pull only.
            saved_timeout = client.api.timeout
            client.api.timeout = pull_timeout
            try:
                for msg in client.api.pull(repo, tag=tag, stream=True, decode=True):
                    if "error" in msg:
                        raise SandboxImageError(str(msg["error"]))
            finally:
                client.api.timeout = saved_timeout
    except (
        docker.errors.DockerException,
        requests.RequestException,
        SandboxImageError,
    ) as exc:
        progress(
            f"pull of {base} failed ({str(exc).splitlines()[0][:200]}); building offline"
        )
        return build_offline_image(name, force=force, progress=progress, client=client)

    dockerfile = _DERIVED_DOCKERFILE.format(
        base=base,
        home=AGENT_HOME,
        uid=AGENT_UID,
        user=AGENT_USER,
        testbed=TESTBED,
        label=SANDBOX_LABEL,
    )
    progress(f"building {name} from {base}")
    try:
        client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()), tag=name, rm=True, pull=False
        )
    except (docker.errors.BuildError, docker.errors.APIError) as exc:
        raise SandboxImageError(
            f"building {name} from {base} failed: {exc}. Without network access, "
            "build offline instead: `sudo .venv/bin/harness sandbox build`."
        ) from exc
    return name
