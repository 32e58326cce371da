"""Docker labels that say who made a container or image, so leftovers can be told apart.

Every container the harness starts (bash sandboxes, grading containers) carries the run id,
the program id and the task, plus the process that made it: host name, pid and that
process's start (boot id and start time, so a reused pid is not mistaken for the same
process). `harness sandbox prune` removes the containers whose process is gone; task images
carry the task and the run that built them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

OWNER_LABEL = "harness.owner"  # every harness container: the pid or run id that owns it
RUN_LABEL = "harness.run"
PROGRAM_LABEL = "harness.program"
TASK_LABEL = "harness.task"
PID_LABEL = "harness.pid"
HOST_LABEL = "harness.host"
STARTED_LABEL = "harness.pid_started"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def process_started(pid: int) -> str | None:
    """`<boot id>:<start time in clock ticks>` of a live process; None when it is gone.

    "" where /proc is not available (not Linux): then only the pid can be checked."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    # the command name (field 2) may hold spaces and parentheses: count from its end
    fields = stat[stat.rfind(")") + 2:].split()
    return f"{_boot_id()}:{fields[19]}" if len(fields) > 19 else ""


def process_labels(run_id: str | None = None, program_id: str | None = None,
                   task: str | None = None) -> dict[str, str]:
    """The labels for something this process makes (empty values are left out)."""
    labels = {HOST_LABEL: socket.gethostname(), PID_LABEL: str(os.getpid()),
              STARTED_LABEL: process_started(os.getpid()) or "",
              RUN_LABEL: run_id or "", PROGRAM_LABEL: program_id or "", TASK_LABEL: task or ""}
    return {k: v for k, v in labels.items() if v}


def process_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the process that made a labelled object still runs: True, False, or None
    when this machine cannot tell (another host, or no pid label)."""
    if labels.get(HOST_LABEL, socket.gethostname()) != socket.gethostname():
        return None
    pid = labels.get(PID_LABEL) or labels.get(OWNER_LABEL, "")
    if not pid.isdigit():
        return None
    if not os.path.exists("/proc"):
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    started = process_started(int(pid))
    if started is None:
        return False
    expected = labels.get(STARTED_LABEL)
    return not expected or not started or started == expected
