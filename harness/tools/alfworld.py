"""ALFWorld: one real TextWorld household game per agent program.

A game is a `.tw-pddl` file (ALFWorld's PDDL domain, its grammar with the task text, the
room as a PDDL problem); `datasets/alfworld/build_games.py` writes the shipped ones. The game
runs in TextWorld's PDDL engine (fast-downward underneath) wrapped as ALFWorld wraps it
(`AlfredDemangler`: objects are shown as "apple 1", "countertop 2"), so observations,
admissible commands and the win check are ALFWorld's own.

`start()` returns the room and the task; `run(command)` plays one command, e.g.
`go to countertop 1`, `take apple 1 from countertop 1`, `move apple 1 to fridge 1` (0.4.x
spelling; `put apple 1 in/on fridge 1` is accepted as an alias), `open fridge 1`,
`heat/cool/clean apple 1 with microwave 1 / fridge 1 / sinkbasin 1`, `use desklamp 1`,
`examine ...`, `look`, `inventory`. A command that is not admissible gets ALFWorld's
"Nothing happens." (`ok=False`). `done` is set when the game is won. `info` carries
`admissible_commands`, `won`, `score`, `moves` (commands the engine accepted).

`expert_plan()` gives a winning command list: ALFWorld's "planner" expert (fast-downward's
optimal plan from the current state) or its "handcoded" expert (heuristic search with
exploration, played from the start on a private copy of the game), for recording
trajectories.

The engine is blocking, so every call runs in a thread. It is not thread-safe (TextWorld's
module-level parsers; fast-downward's translator changes its options, `sys.argv` and
`sys.stdout`), so engine calls of all games in the process take turns under one lock, and
`sys.argv` is restored after each. A step takes milliseconds, loading a game about 0.3 s.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from harness.tools.base import Observation, Tool

GAMES_DIR = Path(__file__).resolve().parents[2] / "datasets" / "alfworld" / "games"
NOTHING_HAPPENS = "Nothing happens."
EXPERTS = ("planner", "handcoded")
HANDCODED_MAX_STEPS = 150
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
T = TypeVar("T")
_PUT = re.compile(r"^put (.+?) (?:in|on|in/on|into|onto) (.+)$")

# The engine is not thread-safe: TextWorld parses grammar and conditions with module-level
# parsers at every step, and fast-downward's PDDL translator keeps its options in module
# globals and swaps sys.stdout and sys.argv while it runs. One engine call at a time in this
# process (a step takes milliseconds, a load about 0.3 s).
_ENGINE_LOCK = threading.RLock()


class AlfWorldError(RuntimeError):
    """The game cannot be loaded or played (missing engine, bad game file)."""


def game_path(game: str | Path) -> Path:
    """A game file: a path, or the name of a shipped game (`datasets/alfworld/games`)."""
    path = Path(game)
    if path.is_file():
        return path
    shipped = GAMES_DIR / (path.name if path.suffix == ".tw-pddl" else f"{path.name}.tw-pddl")
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in GAMES_DIR.glob("*.tw-pddl")) if GAMES_DIR.is_dir() else []
    hint = f"; shipped games: {', '.join(names)}" if names else ""
    raise AlfWorldError(f"no ALFWorld game {str(game)!r} (not a file, not a shipped game){hint}")


def _engine() -> tuple[Any, Any]:
    try:
        # TextWorld and ALFWorld: start-up cost (~2 s), only a game needs them
        import textworld
        from alfworld.agents.environment import alfred_tw_env
    except ImportError as exc:
        raise AlfWorldError(
            f"ALFWorld is not installed ({exc}); install it with "
            '`PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install alfworld==0.4.2`'
        ) from exc
    return textworld, alfred_tw_env


def _locked(fn: Callable[..., T], *args: Any) -> T:
    """Run one engine call under the engine lock; restore the `sys.argv` it may replace."""
    with _ENGINE_LOCK:
        argv = sys.argv
        try:
            return fn(*args)
        finally:
            sys.argv = argv


def _start_env(path: Path, infos_kwargs: dict[str, Any], wrappers: list[Any]) -> tuple[Any, Any]:
    """Load and reset a game as ALFWorld does; return (env, first state)."""
    textworld, alfred_tw_env = _engine()
    infos = textworld.EnvInfos(**infos_kwargs)
    env = textworld.start(str(path), request_infos=infos,
                          wrappers=[alfred_tw_env.AlfredDemangler(), *wrappers])
    try:
        state = env.reset()
    except BaseException:
        _close_env(env)
        raise
    return env, state


def _close_env(env: Any) -> None:
    """Close the game and free the planner state in its private copy of fast-downward.

    Every game loads its own copy of `libdownward.so`. The copy stays mapped (about 1 MB
    resident): unloading it (`fast_downward.close_lib`, i.e. dlclose) makes a later load in
    another thread crash the process now and then, so only its memory is released.
    """
    try:
        env.close()
    finally:
        lib = getattr(env.unwrapped, "downward_lib", None)
        if lib is not None:
            env.unwrapped.downward_lib = None
            lib.cleanup()


def _intro(feedback: str) -> str:
    text = feedback.strip()
    if text.startswith(_BANNER):
        text = text[len(_BANNER):].strip()
    return text


def _normalize(command: str) -> str:
    text = " ".join(command.strip().split()).lower()
    return text.rstrip(".!").strip()


def read_game(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AlfWorldError(f"cannot read ALFWorld game {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise AlfWorldError(f"{path} is not a .tw-pddl game (not a JSON object)")
    missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if k not in data]
    if missing:
        raise AlfWorldError(f"{path} is not a .tw-pddl game (missing {', '.join(missing)})")
    return data


class AlfWorldTool(Tool):
    """One ALFWorld game, played one command per call."""

    name = "alfworld"
    description = (
        "Act in a text household (ALFWorld). One command per call: 'go to <receptacle>', "
        "'open/close <receptacle>', 'take <object> from <receptacle>', "
        "'move <object> to <receptacle>', 'heat/cool/clean <object> with "
        "<microwave/fridge/sinkbasin>', 'use <lamp>', 'examine <something>', 'look', "
        "'inventory'. Names are as shown, e.g. 'apple 1', 'countertop 2'. "
        "A command that does not apply gives 'Nothing happens.'"
    )

    def __init__(self, game: str | Path) -> None:
        self.game = game_path(game)
        self._data = read_game(self.game)
        meta = self._data.get("alfworld") or {}
        self.task_type: str | None = meta.get("task_type")
        self.goal: str | None = meta.get("goal")
        self._env: Any = None
        self._state: Any = None
        self._done = False
        self._closed = False
        self._lock = asyncio.Lock()

    # ---------------------------------------------------------------------------- playing

    async def start(self) -> Observation:
        """(Re)start the game; the observation is the room and the task."""
        async with self._lock:
            if self._closed:
                raise AlfWorldError("the ALFWorld game was closed")
            old, self._env = self._env, None
            if old is not None:
                await asyncio.to_thread(_locked, _close_env, old)
            try:
                env, state = await asyncio.to_thread(
                    _locked, _start_env, self.game,
                    {"won": True, "admissible_commands": True, "moves": True}, [])
            except AlfWorldError:
                raise
            except Exception as exc:  # a malformed game: PDDL/grammar parse errors
                raise AlfWorldError(f"cannot load ALFWorld game {self.game}: "
                                    f"{type(exc).__name__}: {exc}") from exc
            self._env, self._state, self._done = env, state, False
            return self._observation(_intro(state["feedback"]), ok=True, command=None)

    async def run(self, argument: str) -> Observation:
        """Play one command. Starts the game first if `start()` was not called (the task
        text then is only in `start()`'s observation, so programs should call it)."""
        if self._env is None and not self._closed:
            await self.start()
        async with self._lock:
            if self._env is None:
                raise AlfWorldError("the ALFWorld game was closed")
            if self._done:
                return self._observation("The game is over: the task is done.", ok=False,
                                         command=None)
            command = self._resolve(argument)
            admissible = command in self._state["admissible_commands"]
            state, _, done = await asyncio.to_thread(_locked, self._env.step, command)
            self._state = state
            self._done = bool(done or state["won"])
            text = state["feedback"].strip() or NOTHING_HAPPENS
            return self._observation(text, ok=admissible, command=command)

    def _resolve(self, argument: str) -> str:
        """The command as the engine spells it; `put X in/on Y` -> `move X to Y`."""
        command = _normalize(argument)
        admissible = self._state["admissible_commands"]
        if command not in admissible and (m := _PUT.match(command)):
            alias = f"move {m.group(1)} to {m.group(2)}"
            if alias in admissible:
                return alias
        return command

    def _observation(self, text: str, *, ok: bool, command: str | None) -> Observation:
        state = self._state
        won = bool(state["won"])
        info: dict[str, Any] = {
            "admissible_commands": list(state["admissible_commands"]),
            "won": won,
            "score": 1 if won else 0,
            "moves": int(state["moves"] or 0),
            "game": self.game.stem,
        }
        if command is not None:
            info["command"] = command
            info["admissible"] = ok
        if self.task_type:
            info["task_type"] = self.task_type
        return Observation(text, ok=ok, done=self._done, info=info)

    @property
    def admissible_commands(self) -> list[str]:
        return list(self._state["admissible_commands"]) if self._state is not None else []

    # ---------------------------------------------------------------------------- experts

    async def expert_plan(self, expert: str = "planner") -> list[str]:
        """Commands that win the game.

        `planner`: ALFWorld's planner expert, fast-downward's optimal plan from the current
        state of this game (started if it was not). `handcoded`: ALFWorld's handcoded expert
        (`HandCodedTWAgent`), played from the start on a private copy of the game; its plan
        explores like ALFWorld's recorded demonstrations. It can differ between calls where
        the expert picks at random (among equal objects; after repeating itself), though on
        the shipped games it has always been the same. Raises AlfWorldError if it fails.
        """
        if expert not in EXPERTS:
            raise ValueError(f"unknown expert {expert!r}; use one of {', '.join(EXPERTS)}")
        if expert == "handcoded":
            return await asyncio.to_thread(handcoded_plan, self.game, self._data)
        if self._env is None:
            await self.start()
        async with self._lock:
            if self._env is None:
                raise AlfWorldError("the ALFWorld game was closed")
            if self._state["won"]:
                return []
            env = self._env.unwrapped
            plan = await asyncio.to_thread(
                _locked, env._pddl_state.replan, env._entity_infos)
            if not plan:
                raise AlfWorldError(f"the planner found no plan for {self.game.stem}")
            return list(plan)

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            env, self._env = self._env, None
            if env is not None:
                await asyncio.to_thread(_locked, _close_env, env)


def handcoded_plan(game: Path, data: dict[str, Any] | None = None,
                   max_steps: int = HANDCODED_MAX_STEPS) -> list[str]:
    """Play `game` from the start with ALFWorld's handcoded expert; return its commands.

    The expert reads the task from the `traj_data.json` next to the game, as in ALFWorld's
    data layout, so the game is copied into a temporary folder with one written from the
    game's `alfworld` task parameters.
    """
    _, alfred_tw_env = _engine()
    data = data if data is not None else read_game(game)
    meta = data.get("alfworld")
    if not meta or "task_type" not in meta or "pddl_params" not in meta:
        raise AlfWorldError(f"{game.name} has no ALFWorld task parameters ('alfworld' key); "
                            "the handcoded expert needs them")
    with tempfile.TemporaryDirectory(prefix="alfworld-expert-") as tmp:
        copy = Path(tmp) / "game.tw-pddl"
        shutil.copyfile(game, copy)
        traj = {"task_type": meta["task_type"], "pddl_params": meta["pddl_params"]}
        (Path(tmp) / "traj_data.json").write_text(json.dumps(traj))
        expert = _handcoded_expert_wrapper()
        env, state = _locked(
            _start_env, copy,
            {"won": True, "admissible_commands": True, "extras": ["expert_plan"]},
            [alfred_tw_env.AlfredInfos, expert])
        try:
            plan: list[str] = []
            while not state["won"]:
                if len(plan) >= max_steps:
                    raise AlfWorldError(f"the handcoded expert did not win {game.name} "
                                        f"in {max_steps} steps")
                command = state["extra.expert_plan"][0]
                plan.append(command)
                state, _, _ = _locked(env.step, command)
            return plan
        except AlfWorldError:
            raise
        except Exception as exc:  # the expert raises bare Exception("Timeout") and friends
            raise AlfWorldError(f"the handcoded expert failed on {game.name}: {exc}") from exc
        finally:
            _locked(_close_env, env)


def _expert_spelling(command: str) -> str:
    """`move X to Y` -> `put X in Y`: the spelling the handcoded expert's tracking expects."""
    if command.startswith("move ") and " to " in command:
        return "put " + command[len("move "):].replace(" to ", " in ", 1)
    return command


def _handcoded_expert_wrapper() -> Any:
    """ALFWorld's `AlfredExpert` wrapper (handcoded expert), fixed for 0.4.x's `move`.

    alfworld 0.4.2 renamed the put command to `move X to Y`, but its handcoded expert still
    recognises a put by the word "put" in the last command; after a `move` it believes it
    still holds the object, so it wanders on pick-two tasks (most runs fail in 150 steps).
    This wrapper tells the expert the last command in the old spelling; nothing else changes.
    """
    # TextWorld and ALFWorld: start-up cost (~2 s), only a game needs them
    import textworld
    from alfworld.agents.environment import alfred_tw_env

    class HandcodedExpert(alfred_tw_env.AlfredExpert):  # type: ignore[misc]
        def step(self, command: str) -> Any:
            self.state, reward, done = textworld.core.Wrapper.step(self, command)
            self.prev_command = _expert_spelling(str(command))
            self._gather_infos()
            return self.state, reward, done

    return HandcodedExpert(expert_type=alfred_tw_env.AlfredExpertType.HANDCODED)
