"""Write the ALFWorld games shipped with harness (`games/*.tw-pddl`) and `tasks.jsonl`.

Run from the repository root: `.venv/bin/python datasets/alfworld/build_games.py`
(`--check` rebuilds in memory and fails if a shipped file differs).

The alfworld wheel ships ALFWorld's PDDL domain and TextWorld grammar but no games; the
original games are generated from ALFRED scenes we do not have. Each game here is a small room
described in `GAMES` below (receptacles, the objects in/on them, the goal). Everything else
comes from the installed alfworld package at build time: the domain (`alfred.pddl`), the
grammar (`alfred.twl2`, the task text put in place of "UNKNOWN GOAL" as ALFWorld does), the
goal formula and task text of each task type (`alfworld.gen.goal_library`), and the object
affordances (which receptacle type can hold which object, what is openable, cleanable,
heatable, coolable, toggleable: `alfworld.gen.constants`).

Every game is verified before it is written: it is loaded by TextWorld's PDDL engine with
ALFWorld's name demangler, the names the player sees are checked against the description,
and the optimal plan of the fast-downward planner must win it. That plan is stored as the
game's `walkthrough` (TextWorld's key for it); the ALFWorld task parameters (the ones
ALFWorld keeps in `traj_data.json`) are stored under `alfworld` so that ALFWorld's handcoded
expert can play the game too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
GAMES_DIR = HERE / "games"
TASKS_FILE = HERE / "tasks.jsonl"


@dataclass(frozen=True)
class GameSpec:
    """One room and one task. Receptacles are "Type N" (N from 1 per type, as ALFWorld shows
    them); the objects in/on each are types, numbered per type in the order they appear."""

    id: str
    task_type: str
    room: dict[str, list[str]]
    obj: str  # object_target, e.g. "Apple"
    recep: str = ""  # parent_target (a receptacle type), e.g. "Fridge"
    toggle: str = ""  # toggle_target for look_at_obj_in_light, e.g. "DeskLamp"
    template: int = 0  # which of the task type's goal texts to use
    notes: str = field(default="", compare=False)


GAMES: list[GameSpec] = [
    GameSpec(
        id="alfworld-pick-cellphone-dresser",
        task_type="pick_and_place_simple",
        room={
            "Bed 1": ["Pillow", "Laptop"],
            "Desk 1": ["Pencil", "KeyChain"],
            "Drawer 1": [],
            "Drawer 2": ["CreditCard", "CellPhone"],
            "Dresser 1": ["AlarmClock"],
            "GarbageCan 1": [],
        },
        obj="CellPhone",
        recep="Dresser",
    ),
    GameSpec(
        id="alfworld-look-book-desklamp",
        task_type="look_at_obj_in_light",
        room={
            "Bed 1": ["Pillow"],
            "Desk 1": ["Pen", "CD"],
            "Drawer 1": ["KeyChain", "Book"],
            "Shelf 1": ["Vase"],
            "SideTable 1": ["DeskLamp", "AlarmClock"],
        },
        obj="Book",
        toggle="DeskLamp",
    ),
    GameSpec(
        id="alfworld-clean-spatula-drawer",
        task_type="pick_clean_then_place_in_recep",
        room={
            "Cabinet 1": ["Bowl"],
            "CounterTop 1": ["Spatula", "Bread"],
            "DiningTable 1": ["Apple", "Fork"],
            "Drawer 1": [],
            "Fridge 1": ["Egg"],
            "SinkBasin 1": [],
        },
        obj="Spatula",
        recep="Drawer",
        template=1,
    ),
    GameSpec(
        id="alfworld-heat-potato-diningtable",
        task_type="pick_heat_then_place_in_recep",
        room={
            "Cabinet 1": ["Plate"],
            "CounterTop 1": ["Bread", "Knife"],
            "DiningTable 1": ["Cup"],
            "Fridge 1": ["Potato", "Lettuce"],
            "Microwave 1": [],
            "StoveBurner 1": ["Pan"],
        },
        obj="Potato",
        recep="DiningTable",
    ),
    GameSpec(
        id="alfworld-cool-mug-cabinet",
        task_type="pick_cool_then_place_in_recep",
        room={
            "Cabinet 1": ["Plate"],
            "Cabinet 2": [],
            "CoffeeMachine 1": ["Mug"],
            "CounterTop 1": ["Tomato", "SaltShaker"],
            "Fridge 1": ["Apple"],
            "SinkBasin 1": ["Spoon"],
        },
        obj="Mug",
        recep="Cabinet",
    ),
    GameSpec(
        id="alfworld-two-pencil-drawer",
        task_type="pick_two_obj_and_place",
        room={
            "Bed 1": ["Pillow"],
            "Desk 1": ["Pencil", "Pen", "CD"],
            "Drawer 1": [],
            "Drawer 2": ["CreditCard"],
            "Shelf 1": ["Book"],
            "SideTable 1": ["Pencil", "KeyChain"],
        },
        obj="Pencil",
        recep="Drawer",
        template=1,
    ),
]

#: Games for the worked examples in the prompt (`exemplars.json`, `build_exemplars.py`), never
#: tasks: written to `exemplar-games/`, not to `tasks.jsonl`. Their rooms and objects are
#: none of the tasks'.
EXEMPLAR_GAMES: list[GameSpec] = [
    GameSpec(
        id="alfworld-example-apple-fridge",
        task_type="pick_and_place_simple",
        room={
            "Cabinet 1": ["Bowl"],
            "CounterTop 1": ["Knife"],
            "CounterTop 2": ["Apple", "Bread"],
            "Fridge 1": [],
            "SinkBasin 1": [],
        },
        obj="Apple",
        recep="Fridge",
    ),
]
EXEMPLAR_GAMES_DIR = HERE / "exemplar-games"


# --------------------------------------------------------------------------------------------
# alfworld's shipped data


def alfworld_paths() -> tuple[Path, Path]:
    """The PDDL domain and the grammar inside the installed alfworld package."""
    try:
        import alfworld.info as info
    except ImportError:
        sys.exit(
            "error: alfworld is not installed in this Python. Install it with\n"
            '  PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install alfworld==0.4.2\n'
            "and run this script with .venv/bin/python."
        )
    return Path(info.ALFRED_PDDL_PATH), Path(info.ALFRED_TWL2_PATH)


def _instance_id(rtype_or_otype: str, key: int) -> str:
    """A PDDL name that ALFWorld's demangler turns into the lower-case type name.

    ALFWorld names receptacles and objects `Type|x|y|z` (escaped `Type_bar_...`) and shows
    them as "type N". Basins are `Sink|...|SinkBasin` there and shown as "sinkbasin".
    """
    if rtype_or_otype.endswith("Basin"):
        base = rtype_or_otype[: -len("Basin")]
        return f"{base}_bar_{key:02d}_bar_{rtype_or_otype}"
    return f"{rtype_or_otype}_bar_{key:02d}"


def _ids_for(names: list[str]) -> dict[int, str]:
    """Map position -> PDDL id for instances of one type, so that the demangler (which numbers
    instances in sorted-id order, counting down) shows the i-th one as "type i"."""
    n = len(names)
    return {i: _instance_id(names[i], n - 1 - i) for i in range(n)}


@dataclass
class Built:
    spec: GameSpec
    game: dict
    goal_text: str
    names: dict[str, str]  # PDDL id -> name shown to the player


def build_problem(spec: GameSpec, grammar: str) -> tuple[str, str, str, dict[str, str]]:
    """Return (pddl_problem, grammar with the task, goal text, id -> expected shown name)."""
    import alfworld.gen.constants as C
    from alfworld.gen.goal_library import gdict

    if spec.task_type not in gdict:
        raise ValueError(f"{spec.id}: unknown task type {spec.task_type!r}")
    can_contain = C.VAL_RECEPTACLE_OBJECTS
    actions = C.VAL_ACTION_OBJECTS
    openable = set(C.OPENABLE_CLASS_LIST)
    movable_receps = set(C.MOVABLE_RECEPTACLES)

    # Receptacles "Type N", numbered from 1 without gaps.
    rtypes: dict[str, list[str]] = {}
    for label in spec.room:
        rtype, _, num = label.rpartition(" ")
        if not rtype or not num.isdigit():
            raise ValueError(f"{spec.id}: receptacle {label!r} is not 'Type N'")
        if rtype not in C.RECEPTACLES:
            raise ValueError(f"{spec.id}: {rtype!r} is not an ALFWorld receptacle type")
        rtypes.setdefault(rtype, []).append(num)
    recep_id: dict[str, str] = {}
    shown: dict[str, str] = {}
    for rtype, nums in rtypes.items():
        if sorted(int(n) for n in nums) != list(range(1, len(nums) + 1)):
            raise ValueError(f"{spec.id}: {rtype} numbers must be 1..{len(nums)}, got {nums}")
        ids = _ids_for([rtype] * len(nums))
        for i in range(len(nums)):
            label = f"{rtype} {i + 1}"
            recep_id[label] = ids[i]
            shown[ids[i]] = f"{rtype.lower()} {i + 1}"

    # Objects, numbered per type in order of appearance.
    placements: list[tuple[str, str]] = []  # (otype, receptacle label)
    for label, objs in spec.room.items():
        for otype in objs:
            if otype not in C.OBJECTS or otype in C.RECEPTACLES and otype not in movable_receps:
                raise ValueError(f"{spec.id}: {otype!r} is not an ALFWorld object type")
            placements.append((otype, label))
    by_type: dict[str, list[int]] = {}
    for k, (otype, _) in enumerate(placements):
        by_type.setdefault(otype, []).append(k)
    obj_id: dict[int, str] = {}
    for otype, ks in by_type.items():
        ids = _ids_for([otype] * len(ks))
        for i, k in enumerate(ks):
            obj_id[k] = ids[i]
            shown[ids[i]] = f"{otype.lower()} {i + 1}"

    # The goal (ALFWorld's formula and text for the task type).
    entry = gdict[spec.task_type]
    needed = {"obj": spec.obj}
    if spec.task_type == "look_at_obj_in_light":
        needed["toggle"] = spec.toggle
    else:
        needed["recep"] = spec.recep
    for key, value in needed.items():
        if not value:
            raise ValueError(f"{spec.id}: {spec.task_type} needs {key}=")
    if spec.obj not in by_type:
        raise ValueError(f"{spec.id}: the goal object {spec.obj} is not in the room")
    count = {"pick_two_obj_and_place": 2}.get(spec.task_type, 1)
    if len(by_type[spec.obj]) < count:
        raise ValueError(f"{spec.id}: needs {count} x {spec.obj} in the room")
    if spec.recep:
        if spec.recep not in rtypes:
            raise ValueError(f"{spec.id}: the goal receptacle {spec.recep} is not in the room")
        if spec.obj not in can_contain.get(spec.recep, ()):
            raise ValueError(f"{spec.id}: ALFWorld does not allow {spec.obj} in {spec.recep}")
    tool = {
        "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
        "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
        "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
    }.get(spec.task_type)
    if tool and (tool[0] not in rtypes or spec.obj not in actions[tool[1]]):
        raise ValueError(f"{spec.id}: needs a {tool[0]} and a {tool[1].lower()} {spec.obj}")
    if spec.toggle and not any(o == spec.toggle for o, _ in placements):
        raise ValueError(f"{spec.id}: the light {spec.toggle} is not in the room")
    fmt = {"obj": spec.obj, "recep": spec.recep, "toggle": spec.toggle, "mrecep": ""}
    goal_pddl = entry["pddl"].replace("#", "-").format(**fmt)
    lower = {k: v.lower() for k, v in fmt.items()}
    goal_text = entry["templates"][spec.template].format(**lower)

    # Types: the ones used, plus those the domain names as constants.
    otypes = sorted({o for o, _ in placements} | {"Knife", "ButterKnife"})
    rtype_names = sorted(set(rtypes) | {"SinkBasin", "Microwave", "Fridge"})

    objects = ["agent1 - agent", "loc_bar_00 - location"]
    objects += [f"{t}Type - otype" for t in otypes]
    objects += [f"{t}Type - rtype" for t in rtype_names]
    objects += [f"{i} - object" for i in obj_id.values()]
    objects += [f"{i} - receptacle" for i in recep_id.values()]
    locs = {label: f"loc_bar_{k + 1:02d}" for k, label in enumerate(spec.room)}
    objects += [f"{loc} - location" for loc in locs.values()]

    init = ["(atLocation agent1 loc_bar_00)"]  # the middle of the room
    for label, rid in recep_id.items():
        rtype = label.rpartition(" ")[0]
        init.append(f"(receptacleType {rid} {rtype}Type)")
        init.append(f"(receptacleAtLocation {rid} {locs[label]})")
        if rtype in openable:
            init.append(f"(openable {rid})")
    for rtype in sorted(rtypes):
        for otype in otypes:
            if otype in can_contain.get(rtype, ()):
                init.append(f"(canContain {rtype}Type {otype}Type)")
    flags = {
        "cleanable": "Cleanable",
        "heatable": "Heatable",
        "coolable": "Coolable",
        "toggleable": "Toggleable",
        "sliceable": "Sliceable",
    }
    for k, (otype, label) in enumerate(placements):
        oid = obj_id[k]
        init.append(f"(objectType {oid} {otype}Type)")
        init.append(f"(inReceptacle {oid} {recep_id[label]})")
        init.append(f"(objectAtLocation {oid} {locs[label]})")
        if otype not in actions["Toggleable"]:  # lamps stay where they are
            init.append(f"(pickupable {oid})")
        if otype in movable_receps:
            init.append(f"(isReceptacleObject {oid})")
        for pred, group in flags.items():
            if otype in actions[group]:
                init.append(f"({pred} {oid})")

    problem = (
        f"(define (problem {spec.id.replace('-', '_')})\n"
        "(:domain alfred)\n"
        "(:objects\n    " + "\n    ".join(objects) + "\n)\n"
        "(:init\n    " + "\n    ".join(init) + "\n)\n" + goal_pddl.strip() + "\n"
    )
    if "UNKNOWN GOAL" not in grammar:
        raise ValueError("the alfworld grammar has no 'UNKNOWN GOAL' to replace")
    return problem, grammar.replace("UNKNOWN GOAL", goal_text), goal_text, shown


def verify(game: dict, shown: dict[str, str], spec: GameSpec) -> list[str]:
    """Load the game like ALFWorld does, check the names, return the planner's winning plan."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

    fd, path = tempfile.mkstemp(suffix=".tw-pddl")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(game, f)
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["walkthrough"])
        env = textworld.start(path, request_infos=infos, wrappers=[AlfredDemangler()])
        try:
            state = env.reset()
            names = {k.lower(): v.name.strip() for k, v in env._entity_infos.items()}
            for pddl_id, want in shown.items():
                got = names.get(pddl_id.lower())
                if got != want:
                    raise AssertionError(f"{spec.id}: {pddl_id} is shown as {got!r}, want {want!r}")
            plan = list(state["extra.walkthrough"])
            if not plan:
                raise AssertionError(f"{spec.id}: the planner found no plan")
            for cmd in plan:
                if cmd not in state["admissible_commands"]:
                    raise AssertionError(f"{spec.id}: plan step {cmd!r} is not admissible")
                state, _, _ = env.step(cmd)
            if not state["won"]:
                raise AssertionError(f"{spec.id}: the planner's plan does not win")
            return plan
        finally:
            env.close()
            _close_lib(env)
    finally:
        os.unlink(path)


def _close_lib(env) -> None:  # type: ignore[no-untyped-def]
    """Free the planner state of the game's private libdownward copy (not dlclose: unsafe)."""
    lib = getattr(env.unwrapped, "downward_lib", None)
    if lib is not None:
        lib.cleanup()


def build_all(specs: list[GameSpec] | None = None) -> list[Built]:
    """Build and verify `specs` (default: the task games, `GAMES`)."""
    specs = GAMES if specs is None else specs
    domain_path, grammar_path = alfworld_paths()
    domain = domain_path.read_text()
    grammar = grammar_path.read_text()
    ids = Counter(spec.id for spec in specs)
    if dup := [i for i, n in ids.items() if n > 1]:
        raise ValueError(f"duplicate game ids: {dup}")
    built = []
    for spec in specs:
        problem, game_grammar, goal_text, shown = build_problem(spec, grammar)
        game = {
            "pddl_domain": domain,
            "grammar": game_grammar,
            "pddl_problem": problem,
            "solvable": False,
        }
        plan = verify(game, shown, spec)
        game["solvable"] = True
        game["walkthrough"] = plan
        game["alfworld"] = {
            "task_type": spec.task_type,
            "goal": goal_text,
            "pddl_params": {
                "object_target": spec.obj,
                "parent_target": spec.recep,
                "toggle_target": spec.toggle,
                "mrecep_target": "",
                "object_sliced": False,
            },
        }
        built.append(Built(spec, game, goal_text, shown))
    return built


def _dump_game(game: dict) -> str:
    return json.dumps(game, indent=1) + "\n"


def _task_rows(built: list[Built]) -> str:
    rows = []
    for b in built:
        rows.append(
            {
                "id": b.spec.id,
                "game": f"games/{b.spec.id}.tw-pddl",
                "task_type": b.spec.task_type,
                "goal": b.goal_text,
                "expert_steps": len(b.game["walkthrough"]),
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows)


def _write(path: Path, text: str) -> None:
    """Write atomically: a temp file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if the shipped files differ from a rebuild"
    )
    args = parser.parse_args(argv)
    try:
        built = build_all()
        examples = build_all(EXEMPLAR_GAMES)
    except (ValueError, AssertionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    outputs = {GAMES_DIR / f"{b.spec.id}.tw-pddl": _dump_game(b.game) for b in built}
    outputs[TASKS_FILE] = _task_rows(built)
    outputs.update({EXEMPLAR_GAMES_DIR / f"{b.spec.id}.tw-pddl": _dump_game(b.game)
                    for b in examples})
    if args.check:
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        known = {p.name for p in outputs}
        extra = [p for folder in (GAMES_DIR, EXEMPLAR_GAMES_DIR)
                 for p in folder.glob("*.tw-pddl") if p.name not in known]
        for p in stale + extra:
            print(f"out of date: {p.relative_to(HERE)}", file=sys.stderr)
        return 1 if stale or extra else 0
    for path, text in outputs.items():
        _write(path, text)
    for b in built:
        print(f"{b.spec.id}: {b.goal_text!r}, planner plan {len(b.game['walkthrough'])} steps")
    print(f"wrote {len(built)} games to {GAMES_DIR} and {TASKS_FILE}, {len(examples)} "
          f"example games to {EXEMPLAR_GAMES_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
