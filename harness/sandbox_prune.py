"""`harness sandbox prune`: remove what dead runs left on the Docker engine.

A run that is killed (a crash, SIGKILL, a lost terminal) never removes its containers. Every
container the harness makes is labelled with the process that made it
(`harness.tools.labels`), so we can tell which ones nobody will ever remove:

* containers (bash sandboxes, grading containers) whose process is gone on this host;
* task images no run will use again: untagged ones, ones made by an older harness (keyed by
  instance id alone), ones built on a sandbox image that no longer exists or from a
  repository file that no longer exists (on this host), and older images of the same task
  and repository file when a newer one exists (the file changed), unless the process that
  built them still runs.

Containers of live processes, of other hosts, and images in use are kept. `harness run`
warns at start when it finds leftovers.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from harness.benchmarks import swebench_grading as grading
from harness.tools import labels as lb


@dataclass(frozen=True)
class Leftover:
    kind: str  # "container" | "image"
    id: str
    name: str
    reason: str


def _run_matches(labels: dict[str, str], run_id: str | None) -> bool:
    return run_id is None or labels.get(lb.RUN_LABEL) == run_id


def dead_containers(client: Any, run_id: str | None = None) -> list[Leftover]:
    found = []
    for container in client.containers.list(all=True, filters={"label": lb.OWNER_LABEL},
                                             ignore_removed=True):
        labels = container.labels or {}
        if not _run_matches(labels, run_id) or lb.process_alive(labels) is not False:
            continue
        pid = labels.get(lb.PID_LABEL) or labels.get(lb.OWNER_LABEL)
        what = ", ".join(f"{k.split('.')[-1]} {labels[k]}" for k in
                         (lb.RUN_LABEL, lb.TASK_LABEL) if labels.get(k))
        found.append(Leftover("container", container.id, container.name,
                              f"process {pid} is gone" + (f" ({what})" if what else "")))
    return found


def run_containers(client: Any, run_id: str) -> list[Any]:
    """The containers this process made for run `run_id` that still exist."""
    return client.containers.list(all=True, ignore_removed=True, filters={"label": [
        f"{lb.RUN_LABEL}={run_id}", f"{lb.PID_LABEL}={os.getpid()}"]})


def sweep_run(client: Any, run_id: str) -> tuple[list[str], str | None]:
    """Remove the containers this process made for `run_id` that are still there (a program
    whose engine failed could not remove its own): their names, and why not all could be
    removed (None when all were)."""
    removed: list[str] = []
    try:
        for container in run_containers(client, run_id):
            try:
                container.remove(force=True)
            except Exception as exc:  # noqa: BLE001 - NotFound: gone already; else said below
                if getattr(exc, "status_code", None) != 404:
                    raise
            removed.append(container.name)
    except Exception as exc:  # noqa: BLE001 - the engine is down: say so, prune later
        return removed, (f"could not remove the run's containers ({type(exc).__name__}: "
                         f"{exc}); once the Docker engine answers, `harness sandbox prune "
                         f"--run {run_id}` removes them")
    return removed, None


def stale_task_images(client: Any, run_id: str | None = None) -> list[Leftover]:
    images = client.images.list(filters={"label": grading.TASK_LABEL})
    existing = {image.id for image in client.images.list(all=True)}
    here = socket.gethostname()

    def origin(labels: dict[str, str]) -> tuple[str, str]:
        return labels.get(grading.TASK_LABEL, ""), labels.get(grading.SOURCE_LABEL, "")

    newest: dict[tuple[str, str], Any] = {}
    for image in images:
        labels = image.labels or {}
        if image.tags and grading.KEY_LABEL in labels:
            key = origin(labels)
            if key not in newest or image.attrs["Created"] > newest[key].attrs["Created"]:
                newest[key] = image
    found = []
    for image in images:
        labels = image.labels or {}
        if not _run_matches(labels, run_id):
            continue
        name = image.tags[0] if image.tags else image.short_id
        source = labels.get(grading.SOURCE_LABEL, "")
        newer = newest.get(origin(labels))
        if not image.tags:
            reason = "untagged"
        elif grading.KEY_LABEL not in labels or grading.SOURCE_LABEL not in labels:
            reason = "made by an older harness (cached by instance id alone)"
        elif labels.get("harness.task.sandbox_id") not in existing:
            reason = "built on a sandbox image that no longer exists"
        elif lb.process_alive(labels) is True:
            continue  # its builder still runs: it may be about to use it
        elif source and labels.get(lb.HOST_LABEL) == here and not os.path.exists(source):
            reason = f"its repository {source} no longer exists"
        elif newer is not None and newer.id != image.id:
            reason = f"{newer.tags[0]} is newer (the repository {source} changed)"
        else:
            continue
        found.append(Leftover("image", image.id, name, reason))
    return found


def find_leftovers(client: Any, run_id: str | None = None) -> list[Leftover]:
    """Containers of dead runs, then stale task images (see the module docstring)."""
    return dead_containers(client, run_id) + stale_task_images(client, run_id)


def prune(client: Any, run_id: str | None = None, dry_run: bool = False,
          say: Any = print) -> tuple[list[Leftover], list[str]]:
    """Remove the leftovers (containers first: they may hold images); returns what was
    removed and what could not be, each said as it happens."""
    import docker.errors  # type: ignore[import-untyped]

    removed, failed = [], []
    for item in find_leftovers(client, run_id):
        if dry_run:
            say(f"would remove {item.kind} {item.name}: {item.reason}")
            removed.append(item)
            continue
        try:
            if item.kind == "container":
                client.containers.get(item.id).remove(force=True)
            else:
                client.images.remove(item.id, force=False, noprune=False)
        except docker.errors.NotFound:
            continue  # removed meanwhile
        except docker.errors.APIError as exc:
            failed.append(f"{item.kind} {item.name}: {exc.explanation or exc}")
            say(f"kept {item.kind} {item.name}: {exc.explanation or exc}")
            continue
        say(f"removed {item.kind} {item.name}: {item.reason}")
        removed.append(item)
    return removed, failed


def leftover_warning(client: Any) -> str | None:
    """One line for the start of a run when dead runs left something behind, else None."""
    try:
        items = find_leftovers(client)
    except Exception:  # noqa: BLE001 - a warning must never stop a run
        return None
    if not items:
        return None
    containers = sum(i.kind == "container" for i in items)
    images = len(items) - containers
    return (f"warning: earlier runs that ended without cleaning up left {containers} "
            f"container(s) and {images} stale task image(s) on the Docker engine; "
            "`harness sandbox prune` removes them")
