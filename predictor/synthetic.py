"""A seeded generator of synthetic agent requests, in the format of the recorded ones.

Why: our recorded trajectories give ~200 requests from four agents whose replies are nearly all
20-60 tokens (plus one long patch per coding program) and carry no measured tool times. That is
too little, and too narrow, to train or to judge a predictor of output length and tool duration.
This module writes whole agent conversations (system prompt, task, replies, tool outputs) from
templates and word lists written for this project, then cuts them into examples with the same
`request_text` the harness uses, so a generated example looks like a recorded one.

Each family below states the rule that makes its lengths and durations, so what is learnable
from the text is known (and tests can rely on it):

* ``math`` (calculator agent, two system prompts): terse replies are the ReAct lines themselves
  (counted with our tokenizer, ~20-40 tokens); the "tutor" system prompt asks for full
  explanations, 60-140 tokens. calculator: log-normal, median 0.25 ms.
* ``qa`` (search / lookup / finish): replies counted, ~25-45 tokens. search takes a median 12 ms
  on the local corpus and 0.7 s when the system prompt names the MediaWiki API; lookup ~1 ms.
* ``household`` (text game): replies counted, ~28-50 tokens; commands take ~50 ms, a "go to"
  sometimes ~1 s (the simulator moving the agent and re-rendering).
* ``coding`` (bash in a container): exploration replies are counted (40-70 tokens); after a file
  is read (``cat -n`` shows its last line number, so the file's length is visible) the agent
  writes an edit whose length grows with the file and with the issue's scope word (``typo`` <
  default < ``refactor``): 0.9 tokens per line x scope, 100-1800 tokens. Seconds per command
  class, the medians measured on our sandbox runs (runs/swe-bench-*): the first command 1.3 s
  (the container starts), ``cat`` / ``grep`` / ``git`` / ``sed`` 0.1-0.2 s, a python edit
  script 0.6 s; ``pytest`` 0.6 s for one test (``-k`` / ``::``), 2.5 s for the suite, 12 s for
  a ``slow`` suite; ``sleep N`` takes N s.
* ``api`` (function-calling assistant, InferCept-style augmentations): the call's duration
  follows its arguments: ``image_generate`` 0.09 s per diffusion step, ``text_to_speech``
  0.3 s + 0.06 s per word, ``sql_query`` 0.05 s x (1 + 3 per JOIN), ``web_search`` 0.8 s,
  ``get_weather`` 0.35 s; the final answer's length follows the user's wording ("in one
  sentence" ~25, "briefly" ~60, default ~120, "a detailed report" ~450 tokens).
* ``chat`` (no tool): "Write a N-word ..." gives ~1.33 N tokens, "list N ..." ~13 N,
  "in one word" 2-4, "explain ... to a beginner" ~300.

Every random choice comes from one `random.Random(seed)`, so a seed gives the same examples on
every machine (token counts depend on our tokenizer, which is committed).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from predictor.data import Example, TokenCounter, reply_tokens, request_text

FAMILY_WEIGHTS: dict[str, float] = {
    "chat": 0.36, "api": 0.22, "coding": 0.13, "household": 0.08, "math": 0.10, "qa": 0.11,
}

NAMES = ["Ada", "Bram", "Chiara", "Dmitri", "Esi", "Farid", "Greta", "Hiro", "Ines", "Jonah",
         "Kalani", "Lior", "Mireille", "Nuno", "Oona", "Pavel", "Quinn", "Rosa", "Soren", "Tamsin"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cupcakes", "notebooks", "bolts", "tickets",
         "seedlings", "candles", "buttons", "postcards"]
PLACES = ["Dunmere", "Kestrel Bay", "Oxley Ford", "Marrowgate", "Pellin", "Saltwick", "Thornby",
          "Vale Roth", "Wickham Cross", "Brindle"]
TOPICS = ["tide pools", "the history of bridges", "sourdough baking", "night trains",
          "urban beekeeping", "lighthouse keepers", "glacier retreat", "board game design",
          "volcanic soil", "paper making", "migrating cranes", "old maps", "solar kilns",
          "river deltas", "clock repair", "mushroom foraging"]
GENRES = ["short story", "blog post", "essay", "product description", "letter", "speech",
          "poem", "news article"]
OBJECTS = ["mug", "apple", "book", "spatula", "cellphone", "pencil", "potato", "plate",
           "knife", "towel", "egg", "vase"]
RECEPTACLES = ["cabinet", "countertop", "drawer", "fridge", "shelf", "desk", "sinkbasin",
               "microwave", "dresser", "diningtable", "sidetable", "garbagecan"]
MODULES = ["tally", "skein", "parcel", "ledger", "quire", "hopper", "cinder", "fathom",
           "warble", "gazette", "bramble", "lattice"]
FUNCS = ["parse", "render", "merge", "normalize", "split_rows", "to_iso", "from_text", "resolve",
         "expand", "validate", "sniff", "encode"]
BUGS = ["raises ValueError on an empty string", "drops the last element",
        "ignores the timezone offset", "returns the wrong sign for negative input",
        "treats quoted separators as field breaks", "loses trailing whitespace",
        "accepts out-of-range values", "double-counts the first entry"]
SCOPES = {"typo": 0.35, "small": 0.6, "": 1.0, "refactor": 1.9}


@dataclass
class Turn:
    """One request of a generated program: the reply that answers it and the call it makes.
    `output_tokens` None: count the reply with our tokenizer; else the reply stands for a
    longer text (an edit script, an essay) whose length the family's rule drew."""

    reply: str
    observation: str | None
    tool: str | None = None
    call: str | None = None
    seconds: float | None = None
    output_tokens: int | None = None


def lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _secs(x: float) -> float:
    return round(max(x, 1e-5), 5)


# -- families ------------------------------------------------------------------------------


def math_program(rng: random.Random) -> tuple[list[dict[str, Any]], list[Turn]]:
    tutor = rng.random() < 0.35
    system = ("You are a patient tutor. Before each computation explain your reasoning in full "
              "sentences, then act. Use `Action: calculator[expression]` for arithmetic and "
              "`Action: finish[number]` for the final answer."
              if tutor else
              "Solve the word problem step by step and use the calculator for every "
              "computation. Each reply: `Thought: ...` then one line `Action: calculator[expr]` "
              "or `Action: finish[number]`.")
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(3, 60), rng.randint(2, 24), rng.randint(1, 40)
    price = rng.randint(2, 9)
    steps: list[tuple[str, int]] = [(f"{a} * {b}", a * b), (f"{a * b} - {c}", a * b - c)]
    question = (f"{name} packs {a} boxes with {b} {item} in each box, then gives {c} {item} to "
                f"a neighbour.")
    if rng.random() < 0.5:
        question += f" Each of the remaining {item} sells for ${price}. How much money is made?"
        steps.append((f"{a * b - c} * {price}", (a * b - c) * price))
    else:
        question += f" How many {item} are left?"
    turns = []
    for j, (expr, value) in enumerate(steps, 1):
        if tutor:
            why = rng.choice([
                f"We know there are {a} boxes and each one holds {b} {item}, so the quantity "
                "we need next comes from combining these numbers.",
                f"The question is about what {name} has after each change, so I keep track of "
                "the running total and apply the next operation to it.",
                "Breaking the problem into small operations keeps every intermediate value easy "
                "to check against the story.",
            ])
            extra = " ".join(rng.sample([
                "This is a multiplication because every box holds the same amount.",
                "Giving items away lowers the total, which is a subtraction.",
                "Money made is the count of items times the price of one item.",
                "I will double-check the units: the result is still a count of items.",
                "After this step only one more operation remains before the answer.",
            ], k=rng.randint(1, 3)))
            reply = f"Thought: Step {j}. {why} {extra} So I compute {expr}.\n" \
                    f"Action: calculator[{expr}]"
        else:
            reply = f"Thought: step {j}, compute {expr}.\nAction: calculator[{expr}]"
        turns.append(Turn(reply, f"Observation: {value}", "calculator", expr,
                          _secs(lognormal(rng, 0.00025, 0.5))))
    answer = steps[-1][1]
    final = (f"Thought: All steps are done and checked: the final value is {answer}, which "
             f"answers the question about {name}'s {item}.\nAction: finish[{answer}]"
             if tutor else f"Thought: the answer is {answer}.\nAction: finish[{answer}]")
    turns.append(Turn(final, None, "finish", str(answer), 0.0))
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Question: {question}"}], turns


def qa_program(rng: random.Random) -> tuple[list[dict[str, Any]], list[Turn]]:
    online = rng.random() < 0.4
    backend = "the online MediaWiki API" if online else "a local article corpus"
    system = (f"Wikipedia pages come from {backend}. Answer the question with Thought and "
              "Action lines. Actions: search[entity] returns the first sentences of a page, "
              "lookup[keyword] the next sentence with the keyword, finish[answer] answers.")
    person, place, other = rng.choice(NAMES) + " " + rng.choice(["Varrow", "Quell", "Ashdown",
                                                                    "Morrow", "Tansey"]), \
        rng.choice(PLACES), rng.choice(PLACES)
    topic = rng.choice(["river", "founding year", "largest market", "twin town"])
    question = f"What is the {topic} of the town where {person} was born?"
    answer = rng.choice(["River Skell", "1612", "the Wool Hall", other, "River Aun"])
    search_s = (lambda: lognormal(rng, 0.7, 0.45)) if online else \
        (lambda: lognormal(rng, 0.012, 0.4))
    turns = [
        Turn(f"Thought 1: I need to search {person} first.\nAction 1: search[{person}]",
             f"Observation: {person} was a surveyor and engraver, born in {place}. "
             f"{rng.choice(['She', 'He'])} is known for early maps of the coast.",
             "search", person, _secs(search_s())),
        Turn(f"Thought 2: {person} was born in {place}, so I search {place}.\n"
             f"Action 2: search[{place}]",
             f"Observation: {place} is a market town on the {rng.choice(['north', 'east'])} "
             f"bank. Its {topic} is {answer}.", "search", place, _secs(search_s())),
    ]
    if rng.random() < 0.5:
        turns.append(Turn(f"Thought 3: Let me confirm the {topic} on this page.\n"
                          f"Action 3: lookup[{topic.split()[0]}]",
                          f"Observation: (Result 1 / 1) The {topic} of {place} is {answer}.",
                          "lookup", topic.split()[0], _secs(lognormal(rng, 0.001, 0.3))))
    k = len(turns) + 1
    turns.append(Turn(f"Thought {k}: The {topic} of {place} is {answer}.\n"
                      f"Action {k}: finish[{answer}]", None, "finish", answer, 0.0))
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Question: {question}"}], turns


def household_program(rng: random.Random) -> tuple[list[dict[str, Any]], list[Turn]]:
    system = ("You are in a household text game. Act with `Action: alfworld[command]` using the "
              "game's admissible commands (go to X, open X, take X from Y, move X to Y, heat X "
              "with Y, cool X with Y, clean X with Y, use X, look). Reply `Thought: ...` then "
              "one Action line.")
    places = rng.sample(RECEPTACLES, k=5)
    obj = rng.choice(OBJECTS)
    verb = rng.choice(["heat", "cool", "clean", "put"])
    target = places[-1]
    goal = f"put a {obj} in" if verb == "put" else f"{verb} some {obj} and put it in"
    task = (f"You are in the middle of a room. Looking around you see a "
            f"{', a '.join(p + ' 1' for p in places)}.\n\nYour task is to: {goal} {target}.")
    turns = []
    k = 1
    plan = [("go to", places[0]), ("take", f"{obj} 1 from {places[0]} 1")]
    if verb != "put":
        tool_place = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}[verb]
        plan += [("go to", tool_place), (verb, f"{obj} 1 with {tool_place} 1")]
    plan += [("go to", target), ("move", f"{obj} 1 to {target} 1")]
    for cmd, arg in plan:
        arg = f"{arg} 1" if cmd == "go to" else arg
        command = f"{cmd} {arg}"
        think = rng.random() < 0.2
        thought = (f"Thought {k}: The {obj} is needed for the task; I have checked the places I "
                   f"know, so next I {command}." if think else f"Thought {k}: next I {command}.")
        slow = cmd == "go to" and rng.random() < 0.15
        seconds = lognormal(rng, 1.0, 0.2) if slow else lognormal(rng, 0.05, 0.35)
        obs = (f"Observation: You arrive at {arg}. On the {arg}, you see a {obj} 1."
               if cmd == "go to" else f"Observation: You {cmd.split()[0]} the {obj} 1.")
        turns.append(Turn(f"{thought}\nAction {k}: alfworld[{command}]", obs, "alfworld",
                          command, _secs(seconds)))
        k += 1
    turns[-1].observation = None
    return [{"role": "system", "content": system}, {"role": "user", "content": task}], turns


CODING_SYSTEM = (
    "You are a software engineer fixing an issue in a repository through a bash shell in a "
    "sandbox (no network; the repository is at /testbed). Every reply: a short THOUGHT, then "
    "exactly one fenced bash block with one command. Submit with `echo SUBMIT_PATCH`.")


def _bash(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```bash\n{command}\n```"


def coding_program(rng: random.Random) -> tuple[list[dict[str, Any]], list[Turn]]:
    module, func = rng.choice(MODULES), rng.choice(FUNCS)
    scope = rng.choice(list(SCOPES))
    words = {"typo": "a typo in", "small": "a small mistake in", "": "a bug in",
             "refactor": "a design flaw that needs a refactor of"}[scope]
    issue = (f"<issue>\nThis looks like {words} {module}/{func}.py: {func}() "
             f"{rng.choice(BUGS)}; the behaviour should match the documentation.\n</issue>")
    n_lines = int(lognormal(rng, 120, 0.7))
    n_lines = min(max(n_lines, 20), 900)
    n_tests = rng.randint(6, 120)
    slow_suite = rng.random() < 0.15
    turns: list[Turn] = []

    def pytest_turn(scope_arg: str, thought: str, passed: bool) -> Turn:
        if scope_arg:
            seconds = lognormal(rng, 0.6, 0.25)
            result = "1 passed" if passed else "1 failed"
        else:
            seconds = lognormal(rng, 12.0 if slow_suite else 2.5, 0.3)
            result = (f"{n_tests} passed" if passed else
                      f"{rng.randint(1, 4)} failed, {n_tests - 4} passed")
        cmd = f"python3 -m pytest -q {scope_arg}".rstrip()
        return Turn(_bash(thought, cmd),
                    f"<returncode>{0 if passed else 1}</returncode>\n<output>\n"
                    f"{'.' * min(n_tests, 40)}\n{result} in {seconds:.2f}s\n</output>",
                    "pytest", cmd, _secs(seconds + 0.05))

    listing = "\n".join([f"{module}/", "tests/", "README.md", "pyproject.toml",
                         f"./{module}/__init__.py", f"./{module}/{func}.py",
                         f"./tests/test_{func}.py"] + (["./tests/test_slow_integration.py"]
                                                       if slow_suite else []))
    turns.append(Turn(_bash(f"The issue is about {func}(). First I look at the repository "
                            "layout.", "ls -F && find . -name '*.py' -not -path './.git/*'"),
                      f"<returncode>0</returncode>\n<output>\n{listing}\n</output>", "ls",
                      "ls -F && find . -name '*.py' -not -path './.git/*'",
                      _secs(lognormal(rng, 1.3, 0.12))))
    turns.append(Turn(_bash(f"Let me find where {func} is defined and used.",
                            f"grep -rn 'def {func}' --include='*.py' {module}"),
                      f"<returncode>0</returncode>\n<output>\n{module}/{func}.py:"
                      f"{rng.randint(5, n_lines)}:def {func}(value):\n</output>", "grep",
                      f"grep -rn 'def {func}' --include='*.py' {module}",
                      _secs(lognormal(rng, 0.11, 0.3))))
    starts = ["    return", "    if not", "def", "    for x in", "    # note"]
    body = "\n".join(f"{i:6d}\t{rng.choice(starts)} {rng.choice(FUNCS)}" for i in (1, 2, 3))
    tail = "\n".join(f"{i:6d}\t    return {rng.choice(FUNCS)}(x)" for i in
                     range(n_lines - 2, n_lines + 1))
    turns.append(Turn(_bash(f"I read {module}/{func}.py to understand the implementation.",
                            f"cat -n {module}/{func}.py"),
                      f"<returncode>0</returncode>\n<output>\n{body}\n...\n{tail}\n</output>",
                      "cat", f"cat -n {module}/{func}.py", _secs(lognormal(rng, 0.14, 0.4))))
    if rng.random() < 0.6:
        turns.append(pytest_turn("", "Before changing anything I run the tests for a baseline.",
                                 passed=rng.random() < 0.5))
    if rng.random() < 0.08:
        n = rng.choice([2, 5, 10, 20])
        turns.append(Turn(_bash("The background job writes its log late; I wait for it.",
                                f"sleep {n} && tail -n 5 /tmp/job.log"),
                          "<returncode>0</returncode>\n<output>\njob done\n</output>", "sleep",
                          f"sleep {n} && tail -n 5 /tmp/job.log",
                          _secs(n + lognormal(rng, 0.1, 0.3))))
    edit_tokens = int(min(1800, max(100, 0.9 * n_lines * SCOPES[scope]
                                    * math.exp(rng.gauss(0, 0.15)) + 60)))
    how = rng.random()
    if how < 0.5:
        cmd, tool, secs = "python3 - <<'EOF'\n...\nEOF", "python", lognormal(rng, 0.6, 0.3)
    elif how < 0.85:
        cmd, tool, secs = "git apply <<'PATCH'\n...\nPATCH", "git", lognormal(rng, 0.15, 0.3)
    else:
        cmd, tool, secs = f"sed -i 's/old/new/' {module}/{func}.py", "sed", \
            lognormal(rng, 0.08, 0.3)
    turns.append(Turn(_bash(f"I now change {func}() so that it follows the documentation.", cmd),
                      "<returncode>0</returncode>\n<output>\n</output>", tool, cmd, _secs(secs),
                      output_tokens=edit_tokens))
    k = "" if rng.random() < 0.5 else f"-k {func}"
    turns.append(pytest_turn(k, "Now I check the fix with the tests.", passed=True))
    turns.append(Turn(_bash("The tests pass; let me review the diff.", "git diff"),
                      f"<returncode>0</returncode>\n<output>\ndiff --git a/{module}/{func}.py "
                      f"b/{module}/{func}.py\n...\n</output>", "git", "git diff",
                      _secs(lognormal(rng, 0.15, 0.3))))
    turns.append(Turn(_bash("The change is complete; I submit.", "echo SUBMIT_PATCH"), None,
                      "submit", "echo SUBMIT_PATCH", _secs(lognormal(rng, 0.6, 0.5))))
    return [{"role": "system", "content": CODING_SYSTEM},
            {"role": "user", "content": issue}], turns


API_SYSTEM = (
    "You are an assistant with tools: image_generate(prompt, steps), text_to_speech(text), "
    "web_search(query), get_weather(city), sql_query(sql). To use one, reply only with "
    "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>; then answer the user.")

STYLES = {"in one sentence": 25, "briefly": 60, "": 120, "in a detailed report": 450}


def api_program(rng: random.Random) -> tuple[list[dict[str, Any]], list[Turn]]:
    kind = rng.choice(["image", "tts", "search", "weather", "sql"])
    style = rng.choice(list(STYLES))
    topic = rng.choice(TOPICS)
    if kind == "image":
        steps = rng.choice([10, 20, 30, 50, 100])
        ask = f"Make a picture of {topic} at dawn with {steps} diffusion steps and describe it"
        args = {"prompt": f"{topic} at dawn, soft light", "steps": steps}
        seconds = 0.09 * steps * rng.uniform(0.85, 1.15)
    elif kind == "tts":
        n_words = rng.choice([8, 20, 40, 80, 160, 300])
        text = " ".join(rng.choice(TOPICS).split()[-1] for _ in range(n_words))
        ask = f"Read this aloud ({n_words} words) and tell me how it went: {text[:120]}"
        args = {"text": text}
        seconds = 0.3 + 0.06 * n_words * rng.uniform(0.9, 1.1)
    elif kind == "search":
        ask = f"Search the web for recent news about {topic} and summarise it"
        args = {"query": f"{topic} news"}
        seconds = lognormal(rng, 0.8, 0.35)
    elif kind == "weather":
        city = rng.choice(PLACES)
        ask = f"What is the weather in {city} tomorrow, and should I bring a coat"
        args = {"city": city}
        seconds = lognormal(rng, 0.35, 0.3)
    else:
        joins = rng.randint(0, 3)
        sql = "SELECT o.id FROM orders o" + "".join(
            f" JOIN t{j} ON t{j}.id = o.t{j}_id" for j in range(joins)) + " WHERE o.total > 100"
        ask = f"Run this query and explain the result: {sql}"
        args = {"sql": sql}
        seconds = 0.05 * (1 + 3 * joins) * math.exp(rng.gauss(0, 0.2))
    name = {"image": "image_generate", "tts": "text_to_speech", "search": "web_search",
            "weather": "get_weather", "sql": "sql_query"}[kind]
    user = f"{ask}{', ' + style if style else ''}."
    call = json.dumps(args)
    first = Turn(f"<tool_call>{{\"name\": \"{name}\", \"arguments\": {call}}}</tool_call>",
                 f"{{\"status\": \"ok\", \"tool\": \"{name}\"}}", name, call, _secs(seconds))
    answer_tokens = max(4, int(lognormal(rng, STYLES[style], 0.2)))
    last = Turn("(answer)", None, output_tokens=answer_tokens)
    return [{"role": "system", "content": API_SYSTEM}, {"role": "user", "content": user}], \
        [first, last]


def chat_program(rng: random.Random) -> tuple[list[dict[str, Any]], list[Turn]]:
    r = rng.random()
    topic = rng.choice(TOPICS)
    if r < 0.5:
        n = rng.choice([25, 50, 100, 150, 200, 300, 400, 600, 800, 1200])
        ask = f"Write a {n}-word {rng.choice(GENRES)} about {topic}."
        tokens = 1.33 * n * rng.uniform(0.88, 1.12)
    elif r < 0.7:
        n = rng.choice([3, 5, 8, 12, 20, 30])
        ask = f"List {n} facts about {topic}, one per line with a short reason."
        tokens = 13 * n * rng.uniform(0.8, 1.2)
    elif r < 0.85:
        ask = f"In one word, what is the main material in {topic}?"
        tokens = rng.randint(2, 4)
    else:
        ask = f"Explain {topic} to a beginner."
        tokens = lognormal(rng, 300, 0.3)
    system = rng.choice(["You are a helpful assistant.", "You are a concise writing assistant.",
                         "Answer the user's request."])
    return [{"role": "system", "content": system}, {"role": "user", "content": ask}], \
        [Turn("(answer)", None, output_tokens=max(2, int(tokens)))]


FAMILIES: dict[str, Callable[[random.Random], tuple[list[dict[str, Any]], list[Turn]]]] = {
    "math": math_program, "qa": qa_program, "household": household_program,
    "coding": coding_program, "api": api_program, "chat": chat_program,
}


def program_examples(family: str, rng: random.Random, group: str,
                     count: TokenCounter = reply_tokens) -> list[Example]:
    """One generated program cut into examples (one per request), as recorded ones are."""
    messages, turns = FAMILIES[family](rng)
    examples = []
    for turn in turns:
        out = turn.output_tokens if turn.output_tokens is not None else count(turn.reply)
        examples.append(Example(text=request_text(messages), output_tokens=out, tool=turn.tool,
                                call=turn.call, tool_seconds=turn.seconds, group=group,
                                source=f"synthetic:{family}"))
        messages = messages + [{"role": "assistant", "content": turn.reply}]
        if turn.observation is not None:
            observation = turn.observation
            if family == "coding":
                observation = f"Observation: {observation}"
            messages.append({"role": "user" if family != "api" else "tool",
                             "content": observation})
    return examples


def generate(n: int, seed: int = 0, families: dict[str, float] | None = None,
             count: TokenCounter = reply_tokens) -> list[Example]:
    """At least `n` examples (whole programs, so a few more), families drawn by weight."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    weights = families or FAMILY_WEIGHTS
    unknown = set(weights) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)}; known: {sorted(FAMILIES)}")
    rng = random.Random(seed)
    names = sorted(weights)
    cum = [weights[k] for k in names]
    examples: list[Example] = []
    i = 0
    while len(examples) < n:
        family = rng.choices(names, weights=cum)[0]
        examples += program_examples(family, rng, f"synthetic/{seed}/{i:05d}", count)
        i += 1
    return examples
