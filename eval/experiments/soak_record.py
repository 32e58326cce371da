"""The soak's run record: samples as JSON Lines, the progress a resumed run continues from
(written atomically at every sample), and the plot.

Why appended lines for the samples: an hour of samples is rewritten by no one; a soak killed
mid-write leaves at most a torn last line, which reading skips. Everything a resumed run needs
is in ``progress.json`` (`common.atomic`: whole or not at all).
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import psutil

from common.atomic import write_json_atomic


class Record:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.samples_path = out / "samples.jsonl"
        self.progress_path = out / "progress.json"

    def add_sample(self, sample: dict[str, Any]) -> None:
        with open(self.samples_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(sample) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_samples(self) -> list[dict[str, Any]]:
        try:
            lines = self.samples_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        samples = []
        for line in lines:
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a kill
        return samples

    def save_progress(self, progress: dict[str, Any]) -> None:
        write_json_atomic(self.progress_path, progress)

    def read_progress(self) -> dict[str, Any]:
        return json.loads(self.progress_path.read_text(encoding="utf-8"))

    def stop_leftover_server(self) -> None:
        """The server a killed soak left running (its own session: the soak's kill did not
        reach it), stopped by the pid the progress file names, if that is still a `serve`."""
        try:
            pid = int(self.read_progress().get("server_pid") or 0)
            process = psutil.Process(pid) if pid else None
            if process is not None and "serve" in process.cmdline():
                os.killpg(os.getpgid(pid), signal.SIGTERM)
                process.wait(30)
        except (OSError, ValueError, psutil.Error):
            pass


def plot(samples: list[dict[str, Any]], path: Path) -> None:
    """Memory and program states over time, the server going down (a restart) and the
    drain's start marked."""
    import matplotlib  # start-up cost: only the end of a soak draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60.0 for s in samples]
    fig, (mem, held) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for key, label in (("api_rss", "API server"), ("engine_rss", "engine core")):
        mem.plot(t, [(s.get(key) or math.nan) / 2**20 for s in samples], label=label)
    mem.set_ylabel("RSS (MiB)")
    mem.legend()
    for key in ("programs_tracked", "pinned_now", "orphan_blocks", "router_programs",
                "live_clients", "in_flight"):
        held.plot(t, [s.get(key) if s.get(key) is not None else math.nan for s in samples],
                  label=key)
    held.set_ylabel("count")
    held.set_xlabel("minutes")
    held.legend()
    drain = next((s["t"] / 60.0 for s in samples if s.get("phase") == "drain"), None)
    downs = [b["t"] / 60.0 for a, b in zip([{}, *samples], samples, strict=False)
             if b.get("phase") == "down" and a.get("phase") != "down"]
    for ax in (mem, held):
        if drain is not None:
            ax.axvline(drain, color="grey", linestyle="--")
        for x in downs:
            ax.axvline(x, color="red", linestyle=":")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

