"""The `docker`, `engine` and `server` markers, checked against what each test does.

`pytest -m "not docker and not engine and not server"` is the fast loop only while no test in
it talks to Docker, builds a vLLM engine or starts a server; a marker put on by hand drifts as
tests change. So every test is watched as it runs, and one that did such a thing without the
marker fails at teardown, saying which marker and why. What counts (pyproject.toml describes
the markers):

- docker: the test uses the `docker_client` fixture, a docker SDK request of this process got
  an answer from an engine (a client on a dead socket needs no engine), or it runs the `docker`
  command;
- engine: vLLM runs in this process: its `Scheduler` is built (every `VirtualEngine`,
  `CpuEngine`, `tests/vllm_driver.py` driver, virtual cluster, bench and planner simulation
  builds one), its `ModelConfig` (its tokenizer and chat rendering need one), or the
  emulated worker side of its KV offloading or NIXL connector (`EmulatedOffloadWorker`,
  `EmulatedNixlWorker`, driven by hand); or a subprocess runs `tests/cpu_scenarios.py` (the
  `CpuEngine` scenarios);
- server: a subprocess with `serve` in its command line (`harness serve` through
  `ServerProcess` or `python -m cli`, `cli.cluster serve`, `vllm serve`), or the cluster
  launcher starting its replicas (`cluster.launcher.Launcher.start`).

What a fixture's set-up does counts for every test that uses the fixture (a module's server is
started for its first test only). Only this process is watched: what a subprocess does inside
is not seen, so a test whose subprocess needs Docker or an engine, or serves by other means,
carries the marker by hand and says why. `slow` is measured, not checked (`--durations=0`).

The watch is cheap: the classes above are wrapped when their modules are first imported
(conftest imports none of them: vLLM alone takes seconds), subprocesses are seen through the
`subprocess.Popen` audit event. `HARNESS_MARKER_REPORT=1` also lists, at the end, the passed
tests whose `docker`, `engine` or `server` marker nothing above accounts for (a subprocess's
own needs, or a marker that is no longer needed). A test module that imports vLLM when it is
collected is named at the end too: then every run pays vLLM's seconds of start-up, the fast
loop included.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import PurePath
from types import ModuleType
from typing import Any

import pytest

CHECKED = ("docker", "engine", "server")


class _Watch:
    """What the running test, and each fixture being set up, did: kind -> the first reason."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.seen: dict[str, str] = {}
        self.fixtures: list[Any] = []  # the FixtureDefs being set up, innermost last
        self.by_fixture: dict[Any, dict[str, str]] = {}
        self.unexercised: list[str] = []
        self.collecting: str | None = None  # the module being collected
        self.vllm_at_collection: str | None = None

    def note(self, kind: str, why: str) -> None:
        if self.item is None:
            return
        self.seen.setdefault(kind, why)
        if self.fixtures:
            fixture = self.fixtures[-1]
            self.by_fixture.setdefault(fixture, {}).setdefault(
                kind, f"{why}, in fixture `{fixture.argname}`")

    def needs(self, item: pytest.Item) -> dict[str, str]:
        needed = dict(self.seen)
        if "docker_client" in item.fixturenames:
            needed.setdefault("docker", "it uses the docker_client fixture")
        # pytest keeps no public map from a test to the fixture definitions it uses; the last
        # definition of a name is the one in force (a module's own `server` over conftest's)
        for definitions in item._fixtureinfo.name2fixturedefs.values():
            for kind, why in self.by_fixture.get(definitions[-1], {}).items():
                needed.setdefault(kind, why)
        return needed


WATCH = _Watch()


def _wrap(cls: type, method: str, kind: str, why: str, *, after: bool = False) -> None:
    """Note `kind` when `cls.method` is called (`after`: only once it returned)."""
    original = getattr(cls, method)

    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        if not after:
            WATCH.note(kind, why)
        result = original(*args, **kwargs)
        if after:
            WATCH.note(kind, why)
        return result

    setattr(cls, method, watched)


def _watch_scheduler(module: ModuleType) -> None:
    _wrap(module.Scheduler, "__init__", "engine", "it built vLLM's Scheduler in-process")


def _watch_model_config(module: ModuleType) -> None:
    # a pydantic dataclass: its validator calls __post_init__ by name, after validation
    _wrap(module.ModelConfig, "__post_init__", "engine", "it built vLLM's ModelConfig in-process")


def _watch_vllm_import(module: ModuleType) -> None:
    if WATCH.item is None and WATCH.collecting and WATCH.vllm_at_collection is None:
        WATCH.vllm_at_collection = WATCH.collecting


def _watch_offload_worker(module: ModuleType) -> None:
    _wrap(module.EmulatedOffloadWorker, "__init__", "engine",
          "it built the worker side of vLLM's KV offloading connector in-process")


def _watch_nixl_worker(module: ModuleType) -> None:
    _wrap(module.EmulatedNixlWorker, "__init__", "engine",
          "it built the worker side of vLLM's NIXL connector in-process")


def _watch_docker_sdk(module: ModuleType) -> None:
    _wrap(module.APIClient, "send", "docker", "a Docker engine answered its docker SDK request",
          after=True)


def _watch_launcher(module: ModuleType) -> None:
    _wrap(module.Launcher, "start", "server", "the cluster launcher started its replicas")


_ON_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "vllm": _watch_vllm_import,
    "vllm.v1.core.sched.scheduler": _watch_scheduler,
    "vllm.config.model": _watch_model_config,
    "server.emulated.offload": _watch_offload_worker,
    "server.emulated.nixl": _watch_nixl_worker,
    "docker.api.client": _watch_docker_sdk,
    "cluster.launcher": _watch_launcher,
}


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules of `_ON_IMPORT` through the other finders and wraps their classes
    as soon as the module has run, so that nothing is imported before a test asks for it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = _ON_IMPORT.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _subprocess_needs(args: Any) -> Iterator[tuple[str, str]]:
    argv = args.split() if isinstance(args, str | bytes) else list(args)
    words = [os.fsdecode(a) if isinstance(a, str | bytes | os.PathLike) else str(a)
             for a in argv]
    shown = " ".join(words)[:120]
    if "serve" in words:
        yield "server", f"it started `{shown}`"
    if words and PurePath(words[0]).name == "docker":
        yield "docker", f"it ran `{shown}`"
    if any(PurePath(w).name == "cpu_scenarios.py" for w in words):
        yield "engine", f"it ran `{shown}` (CpuEngine in a subprocess)"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen" and WATCH.item is not None:
        for kind, why in _subprocess_needs(args[1]):
            WATCH.note(kind, why)


def install() -> None:
    """Start watching (once per process; called when pytest loads this plugin)."""
    if any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        return
    for name, patch in _ON_IMPORT.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _WrapOnImport())
    sys.addaudithook(_audit)


# -- the hooks; conftest.py loads this module as a plugin (`pytest_plugins`) ---------------------
def pytest_configure(config: pytest.Config) -> None:
    install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    WATCH.item, WATCH.seen = item, {}
    try:
        return (yield)
    finally:
        WATCH.item = None


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Any:
    WATCH.fixtures.append(fixturedef)
    try:
        return (yield)
    finally:
        WATCH.fixtures.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    report = yield
    if call.when == "call" and report.passed and os.environ.get("HARNESS_MARKER_REPORT"):
        item.stash[_passed] = True
    if call.when != "teardown":
        return report
    needed = WATCH.needs(item)
    missing = {k: why for k, why in needed.items() if item.get_closest_marker(k) is None}
    if missing and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"not marked `{kind}`, but {why}: add `@pytest.mark.{kind}` (or to the module's "
            "`pytestmark`); tests/marker_check.py says what each marker stands for"
            for kind, why in sorted(missing.items()))
    if item.stash.get(_passed, False):
        extra = [k for k in CHECKED if item.get_closest_marker(k) and k not in needed]
        if extra:
            WATCH.unexercised.append(f"{item.nodeid}: {', '.join(extra)}")
    return report


_passed = pytest.StashKey[bool]()


def pytest_collectstart(collector: Any) -> None:
    if isinstance(collector, pytest.Module):
        WATCH.collecting = collector.nodeid


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if WATCH.vllm_at_collection:
        terminalreporter.section("vLLM imported while collecting")
        terminalreporter.write_line(
            f"{WATCH.vllm_at_collection} imports vLLM when collected: every run pays its "
            "seconds of start-up, the fast loop too; import it in the tests that need it")
    if WATCH.unexercised:
        terminalreporter.section("markers that nothing in this process accounted for")
        for line in WATCH.unexercised:
            terminalreporter.write_line(line)
