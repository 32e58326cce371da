"""The soak's event loop: the closed loop of sessions, the sampler, the fault tasks, the
drain.

A session is one program of the trace replayed alone (`eval.replay.http_replay`, its turns'
gaps scaled, arriving at once) under a session number; the numbers count up over the run (and
over a resume), so the fault plan draws the same faults for the same number. A session cut by
the server's restart is started again under the same number.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from common.trace import Trace
from eval.experiments.soak_cluster import KILL_REPLICA_AT, ClusterProcess, status_targets
from eval.experiments.soak_faults import (
    RESTART_AT,
    ClientKilled,
    FaultPlan,
    Tally,
    event_bursts,
    faulty_driver,
)
from eval.experiments.soak_judge import DRAINED
from eval.experiments.soak_record import Record
from eval.experiments.soak_sampler import take_sample
from eval.replay.http_replay import HttpReplayError, RequestOptions, areplay_over_http

#: a session that failed for another reason than a restart waits this long before the next
RETRY_PAUSE_S = 1.0


def drain_bound_s(server_bound_s: float, sample_s: float) -> float:
    """How long the drain may take: the server's bound, plus two samples (the one that sees
    zero comes up to a sample late, and the engine's next step up to another)."""
    return server_bound_s + 2 * sample_s


@dataclass(eq=False)
class Soak:
    server: Any
    sessions: list[Any]
    plan: FaultPlan
    record: Record
    options: Any
    run_s: float
    drain_s: float
    tally: Tally = field(init=False)
    #: run seconds already done (a resumed run's earlier part)
    t0: float = field(default=0.0, init=False)
    next_session: int = field(default=0, init=False)
    epoch: int = field(default=0, init=False)
    epoch_start: float = field(default=0.0, init=False)
    restarted: bool = field(default=False, init=False)
    phase: str = field(default="run", init=False)
    live: int = field(default=0, init=False)
    started: float = field(default=0.0, init=False)
    up: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    stop: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.tally = Tally(timeout_s=self.options.request_timeout_s)

    def restore(self, progress: dict[str, Any]) -> None:
        """Continue where a killed soak's progress file left off."""
        self.t0 = float(progress.get("t", 0.0))
        self.next_session = int(progress.get("next_session", 0))
        self.epoch = int(progress.get("epoch", 0)) + 1  # a new server: a new life
        self.epoch_start = self.t0
        self.restarted = bool(progress.get("restarted", False))
        for key, value in (progress.get("tally") or {}).items():
            if hasattr(self.tally, key):
                setattr(self.tally, key, value)

    def now(self) -> float:
        return self.t0 + time.monotonic() - self.started

    async def run(self) -> None:
        self.started = time.monotonic()
        self.up.set()
        tasks = [asyncio.create_task(self.worker()) for _ in range(self.options.sessions)]
        tasks.append(asyncio.create_task(self.sampler()))
        if self.plan.bursts:
            tasks.append(asyncio.create_task(event_bursts(self.server.base_url, self.tally,
                                                          self.stop)))
        restart = None
        if self.plan.restarts and not self.restarted:
            restart = asyncio.create_task(self.restart_at(self.run_s * RESTART_AT))
            tasks.append(restart)
        if self.plan.kills_replica and isinstance(self.server, ClusterProcess) \
                and not self.tally.replicas_killed:
            tasks.append(asyncio.create_task(self.kill_replica_at(self.run_s * KILL_REPLICA_AT)))
        try:
            await asyncio.sleep(max(0.0, self.run_s - self.now()))
            self.stop.set()
            for task in tasks[:self.options.sessions]:
                # the clients leave (each says program_end, unless faulted); a request in
                # flight is cancelled and counted as left at the end (`Tally.left_at_end`)
                task.cancel()
            await asyncio.gather(*tasks[:self.options.sessions], return_exceptions=True)
            if restart is not None and not self.up.is_set():
                await restart  # the drain needs the server back (a failed start raises here)
            self.phase = "drain"
            await self.drain()
        finally:
            self.stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def worker(self) -> None:
        while not self.stop.is_set():
            number = self.next_session
            self.next_session += 1
            program = self.sessions[number % len(self.sessions)]
            faults = self.plan.session(number, program.n_turns)
            trace = Trace(name=f"soak-{number}", programs=[program.model_copy(update={
                "id": f"s{number}-{program.id}", "arrival_s": 0.0})])
            self.tally.no_end_sessions += int(faults.no_end)
            while True:
                await self.up.wait()
                self.live += 1
                try:
                    await areplay_over_http(
                        trace, self.server.base_url, time_scale=self.options.time_scale,
                        requests=RequestOptions(timeout_s=self.options.request_timeout_s,
                                                driver=faulty_driver(faults, self.tally)))
                except ClientKilled:
                    pass
                except HttpReplayError as exc:
                    if not self.up.is_set():  # cut by the restart: this session again
                        self.tally.sessions_restarted += 1
                        continue
                    self.tally.error(str(exc))
                    await asyncio.sleep(RETRY_PAUSE_S)
                except Exception as exc:  # noqa: BLE001 - one session's surprise must not
                    # take a client out of the closed loop for the rest of the hour; a
                    # TaskGroup's ExceptionGroup is named by what it holds
                    self.tally.error(exc)
                    self.tally.log_once(exc)
                    await asyncio.sleep(RETRY_PAUSE_S)
                finally:
                    self.live -= 1
                break
            self.tally.sessions_done += 1

    async def restart_at(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.now()))
        self.up.clear()
        await asyncio.to_thread(self.server.stop)
        await asyncio.to_thread(self.server.start)
        self.epoch += 1  # a new process: its RSS is judged from its own warm-up
        self.epoch_start = self.now()
        self.restarted = True
        self.tally.restarts += 1
        self.up.set()

    async def kill_replica_at(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.now()))
        assert isinstance(self.server, ClusterProcess)
        killed = await asyncio.to_thread(self.server.kill_replica)
        if killed is not None:
            self.tally.replicas_killed.append(killed)

    async def sampler(self) -> None:
        async with httpx.AsyncClient() as client:
            while True:
                await self.sample(client)
                await asyncio.sleep(self.options.sample_s)

    async def sample(self, client: httpx.AsyncClient) -> dict[str, Any]:
        process = self.server.process
        api = (psutil.Process(process.pid)
               if process is not None and process.poll() is None else None)
        client_side = {"live_clients": self.live, "in_flight": len(self.tally.waiting),
                       "oldest_wait_s": round(self.tally.oldest_wait_s(), 3)}
        targets = await status_targets(client, self.server)
        sample = await take_sample(client, list(targets.bases), api, client_side)
        sample["router_programs"] = targets.router_programs
        phase = self.phase if self.up.is_set() else "down"  # restarting
        sample.update(t=round(self.now(), 3), phase=phase, epoch=self.epoch,
                      epoch_start=round(self.epoch_start, 3))
        # with no client left, every block a pin holds is held for no one
        sample["orphan_blocks"] = (sample.get("pinned_blocks")
                                   if self.phase == "drain" else None)
        self.record.add_sample(sample)
        self.record.save_progress({
            "t": sample["t"], "next_session": self.next_session, "epoch": self.epoch,
            "restarted": self.restarted, "phase": self.phase,
            "server_pid": process.pid if process is not None else None,
            "tally": self.tally.record()})
        return sample

    async def drain(self) -> None:
        """No clients: a one-token request per sample keeps the engine stepping (an engine
        with no work never steps, and so never expires a pin); ends early once the program
        table, the pins and the orphaned KV (and a cluster router's program books) are all
        zero."""
        end = self.now() + self.drain_s
        async with httpx.AsyncClient(timeout=30.0) as client:
            while self.now() < end:
                await self.tick(client)
                sample = await self.sample(client)
                if all(not sample.get(key) for key in DRAINED) \
                        and sample.get("pinned_now") is not None:
                    return
                await asyncio.sleep(self.options.sample_s)

    async def tick(self, client: httpx.AsyncClient) -> None:
        """The drain's one-token request: to the server, and under a cluster through the
        router (whose books forget at a routed turn) and to each live replica straight (the
        router would send every one to the same replica, and the others never step)."""
        bases = [self.server.base_url]
        if isinstance(self.server, ClusterProcess):
            bases += (await status_targets(client, self.server)).bases
        try:
            if self.server.served_model is None:
                response = await client.get(f"{self.server.base_url}/v1/models")
                self.server.served_model = response.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            return  # the sample says what state the server is in
        body = {"model": self.server.served_model, "prompt": [1, 2, 3], "max_tokens": 1,
                "vllm_xargs": {"emulate_output_tokens": 1}}
        for base in bases:
            try:
                await client.post(f"{base}/v1/completions", json=body)
            except httpx.HTTPError:
                pass  # a replica going away: the sample says so
