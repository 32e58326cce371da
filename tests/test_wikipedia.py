"""The ReAct Wikipedia tool: offline corpus, the MediaWiki client against a local API server,
observation formats of the paper's environment, and the shipped HotpotQA-style questions."""

from __future__ import annotations

import ast
import asyncio
import json
import socket
from pathlib import Path

import pytest

from harness.tools.mediawiki_stub import MediaWikiStub
from harness.tools.wikipedia import (
    DEFAULT_CORPUS,
    Corpus,
    MediaWikiBackend,
    OfflineBackend,
    SearchResult,
    Similar,
    WikiBackend,
    WikiBackendError,
    WikipediaTool,
    make_backend,
    page_sentences,
    page_summary,
)

QUESTIONS = DEFAULT_CORPUS.parents[1] / "hotpotqa" / "questions.jsonl"


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus.load()


@pytest.fixture(scope="module")
def stub(corpus: Corpus):
    with MediaWikiStub(corpus) as base_url:
        yield base_url


def run(coro):
    return asyncio.run(coro)


def play(tool: WikipediaTool, actions: list[str]) -> list:
    async def go():
        try:
            return [await tool.run(action) for action in actions]
        finally:
            await tool.aclose()

    return run(go())


def similar_list(text: str) -> list[str]:
    prefix, _, rest = text.partition(". Similar: ")
    assert prefix.startswith("Could not find ") and rest.endswith(".")
    return ast.literal_eval(rest[:-1])


# --------------------------------------------------------------------------- page text


def test_sentences_follow_the_paper_splitting_without_double_periods() -> None:
    text = "Title\n\nFirst one. Second one.\nShort line\nThird here! Fourth without end"
    # like the paper, only ". " ends a sentence; a final period is added where missing
    assert page_sentences(text) == ["First one.", "Second one.",
                                    "Third here! Fourth without end."]
    long = " ".join(f"Sentence number {i} here." for i in range(1, 9))
    assert page_summary(long) == " ".join(f"Sentence number {i} here." for i in range(1, 6))


# --------------------------------------------------------------------------- offline tool


def test_search_hit_returns_first_five_sentences(corpus: Corpus) -> None:
    [observation] = play(WikipediaTool(OfflineBackend(corpus)), ["search[Ilse Varrow]"])
    assert observation.ok and not observation.done
    assert observation.info["title"] == "Ilse Varrow"
    assert observation.text.startswith("Ilse Marie Varrow (1788 – 1851) was a cartographer")
    assert "She was born in Dunmere" in observation.text
    article = corpus.get("Ilse Varrow")[0]
    assert observation.text == " ".join(page_sentences(article.text)[:5])
    assert ".." not in observation.text


@pytest.mark.parametrize("query", ["dunmere", "DUNMERE", "  Dunmere ", "Dunmere"])
def test_title_match_ignores_case_and_spacing(corpus: Corpus, query: str) -> None:
    [observation] = play(WikipediaTool(OfflineBackend(corpus)), [f"search[{query}]"])
    assert observation.info["title"] == "Dunmere"


@pytest.mark.parametrize(("query", "title"), [("river_skell", "River Skell"),
                                              ("Skell River", "River Skell"),
                                              ("marrow queen", "SS Marrow Queen")])
def test_underscores_and_aliases_reach_the_page(corpus: Corpus, query: str, title: str) -> None:
    [observation] = play(WikipediaTool(OfflineBackend(corpus)), [f"search[{query}]"])
    assert observation.info["title"] == title


def test_not_found_lists_similar_titles(corpus: Corpus) -> None:
    [observation] = play(WikipediaTool(OfflineBackend(corpus)), ["search[Varrow cartographer]"])
    assert observation.ok
    titles = similar_list(observation.text)
    assert observation.text.startswith("Could not find Varrow cartographer. Similar: [")
    assert titles[0] == "Ilse Varrow"
    assert 1 <= len(titles) <= 5
    assert observation.info["similar"] == titles


def test_not_found_with_nothing_similar() -> None:
    [observation] = play(WikipediaTool(), ["search[Zyxwv Qqq]"])
    assert observation.text == "Could not find Zyxwv Qqq. Similar: []."


def test_disambiguation_page_counts_as_not_found(corpus: Corpus) -> None:
    [observation] = play(WikipediaTool(OfflineBackend(corpus)), ["search[Skell]"])
    titles = similar_list(observation.text)
    assert "River Skell" in titles and "Skell" not in titles


def test_failed_search_keeps_the_current_page(corpus: Corpus) -> None:
    observations = play(WikipediaTool(OfflineBackend(corpus)),
                        ["search[Dunmere]", "search[Nothing Like It]", "lookup[cheese]"])
    assert observations[2].text.startswith("(Result 1 / 1) Today it is known for its weekly")


def test_lookup_cycles_through_results_then_no_more(corpus: Corpus) -> None:
    observations = play(WikipediaTool(OfflineBackend(corpus)), [
        "search[Dunmere]", "lookup[Skell]", "lookup[Skell]", "lookup[Skell]", "lookup[Skell]",
        "lookup[Skell]",
    ])
    texts = [o.text for o in observations[1:]]
    assert texts[0] == ("(Result 1 / 3) Dunmere is a market town on the River Skell, about 40 "
                        "kilometres upstream from the river's mouth at Port Aldry.")
    assert texts[1].startswith("(Result 2 / 3) The town grew up around a ford")
    assert texts[2].startswith("(Result 3 / 3) The old stone bridge over the Skell")
    assert texts[3] == texts[4] == "No more results."


def test_lookup_is_case_insensitive_and_a_new_keyword_or_page_starts_over(corpus) -> None:
    observations = play(WikipediaTool(OfflineBackend(corpus)), [
        "search[Dunmere]", "lookup[skell]", "lookup[skell]", "lookup[SKELL]",
        "lookup[museum]", "search[River Skell]", "lookup[skell]", "lookup[zebra]",
    ])
    texts = [o.text for o in observations]
    assert texts[1].startswith("(Result 1 / 3)")
    assert texts[2].startswith("(Result 2 / 3)")
    assert texts[3].startswith("(Result 1 / 3)")  # another keyword string: start over
    assert texts[4] == ("(Result 1 / 1) The town museum holds a collection of Varrow's survey "
                        "instruments.")
    assert texts[6].startswith("(Result 1 / 3) The River Skell is a river about 118 kilometres")
    assert texts[7] == "No more results."


def test_lookup_before_any_search() -> None:
    [observation] = play(WikipediaTool(), ["lookup[river]"])
    assert observation.text == "No more results."


def test_finish_ends_the_episode_with_the_answer() -> None:
    observations = play(WikipediaTool(), ["search[Dunmere]", "finish[River Skell]",
                                          "search[Halvik]"])
    finish = observations[1]
    assert finish.done is True and finish.ok is True
    assert finish.answer == "River Skell"
    assert "River Skell" in finish.text
    assert observations[2].done is True and observations[2].answer == "River Skell"


@pytest.mark.parametrize("action", ["Dunmere", "jump[high]", "search[]", "lookup[]", ""])
def test_bad_actions_give_error_observations(action: str) -> None:
    [observation] = play(WikipediaTool(), [action])
    assert observation.ok is False and observation.done is False
    assert observation.text.startswith("Invalid action")


def test_run_action_and_action_table() -> None:
    async def go():
        async with WikipediaTool() as tool:
            a = await tool.run_action("search", "Pellham")
            b = await tool.run_action("LOOKUP", "Lake Vantry")
            c = await tool.actions()["lookup"]("Lake Vantry")
            d = await tool.actions()["finish"]("48,200")
            return a, b, c, d

    a, b, c, d = run(go())
    assert a.text.startswith("Pellham is a town on the northern shore of Lake Vantry.")
    assert b.text.startswith("(Result 1 / 2) Pellham is a town")
    assert c.text.startswith("(Result 2 / 2) Pellham has a small harbour")
    assert d.done and d.answer == "48,200"


def test_two_hop_question_offline() -> None:
    observations = play(WikipediaTool(), ["search[Ilse Varrow]", "lookup[born]",
                                          "search[Dunmere]", "finish[River Skell]"])
    assert "born in Dunmere" in observations[1].text
    assert "on the River Skell" in observations[2].text
    assert observations[3].answer == "River Skell"


# --------------------------------------------------------------------------- MediaWiki client

QUERIES = ["Ilse Varrow", "dunmere", "River_Skell", "skell river", "Marrow Queen",
           "ilse marie varrow", "Skell", "Varrow cartographer", "clock company lake",
           "Zyxwv Qqq", "the glass orchard", "Mount Everest"]


@pytest.mark.parametrize("query", QUERIES)
def test_mediawiki_backend_agrees_with_offline(stub: str, corpus: Corpus, query: str) -> None:
    async def go():
        backend = MediaWikiBackend(stub, retries=0)
        try:
            return await backend.search(query)
        finally:
            await backend.aclose()

    live = run(go())
    assert live == run(OfflineBackend(corpus).search(query))
    assert isinstance(live, SearchResult | Similar)


def test_mediawiki_tool_gives_the_same_observations(stub: str, corpus: Corpus) -> None:
    script = ["search[Dunmere]", "lookup[Skell]", "lookup[Skell]", "search[skell]",
              "search[the quiet meridian]", "lookup[Varrow]", "lookup[Varrow]",
              "lookup[Varrow]", "search[nothing of the sort here]", "finish[1788]"]
    live = play(WikipediaTool(MediaWikiBackend(stub, retries=0)), script)
    offline = play(WikipediaTool(OfflineBackend(corpus)), script)
    assert [o.text for o in live] == [o.text for o in offline]
    assert [(o.ok, o.done, o.answer) for o in live] == [(o.ok, o.done, o.answer)
                                                        for o in offline]


def test_stub_speaks_mediawiki_json(corpus: Corpus) -> None:
    stub = MediaWikiStub(corpus)
    pages = stub.answer({"action": "query", "prop": "extracts|pageprops", "redirects": "1",
                         "titles": "skell_River|Nowhere|Skell"})
    query = pages["query"]
    assert query["normalized"][0] == {"fromencoded": False, "from": "skell_River",
                                      "to": "Skell River"}
    assert query["redirects"] == [{"from": "Skell River", "to": "River Skell"}]
    found, missing, disambiguation = query["pages"]
    assert found["title"] == "River Skell" and found["extract"].startswith("The River Skell")
    assert missing == {"ns": 0, "title": "Nowhere", "missing": True}
    assert disambiguation["pageprops"] == {"disambiguation": ""}
    search = stub.answer({"action": "query", "list": "search", "srsearch": "Marrow Queen",
                          "srlimit": "3"})
    hits = search["query"]["search"]
    assert hits[0]["title"] == "SS Marrow Queen" and hits[0]["redirecttitle"] == "Marrow Queen"
    assert len(hits) <= 3
    assert stub.answer({"action": "parse"})["error"]["code"] == "badvalue"


def test_retries_on_5xx_then_succeeds(corpus: Corpus) -> None:
    async def go(base_url: str):
        backend = MediaWikiBackend(base_url, retries=3, backoff=0.01)
        try:
            return await backend.search("Halvik")
        finally:
            await backend.aclose()

    stub = MediaWikiStub(corpus, fail_first=2)
    with stub as base_url:
        result = run(go(base_url))
    assert isinstance(result, SearchResult) and result.title == "Halvik"
    assert len(stub.requests) == 3


def test_persistent_5xx_is_an_error_observation(corpus: Corpus) -> None:
    with MediaWikiStub(corpus, fail_first=100) as base_url:
        tool = WikipediaTool(MediaWikiBackend(base_url, retries=2, backoff=0.01))
        [observation] = play(tool, ["search[Halvik]"])
    assert observation.ok is False and observation.done is False
    assert "unreachable after 3 attempt(s)" in observation.text
    assert "HTTP 503" in observation.text


def test_unreachable_server_is_an_error_observation_not_an_exception() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/w/api.php"
    tool = WikipediaTool(MediaWikiBackend(url, retries=1, backoff=0.01, timeout=2))
    observations = play(tool, ["search[Dunmere]", "lookup[Skell]", "finish[unknown]"])
    assert observations[0].ok is False
    assert observations[0].text.startswith("Wikipedia search failed: MediaWiki API at "
                                           f"{url} is unreachable")
    assert observations[1].text == "No more results."
    assert observations[2].done is True


def test_timeout_is_an_error_observation(corpus: Corpus) -> None:
    with MediaWikiStub(corpus, delay=1.0) as base_url:
        tool = WikipediaTool(MediaWikiBackend(base_url, retries=0, timeout=0.2))
        [observation] = play(tool, ["search[Dunmere]"])
    assert observation.ok is False
    assert "Timeout" in observation.text


def test_non_api_url_is_a_clear_error(corpus: Corpus) -> None:
    with MediaWikiStub(corpus) as base_url:
        bad = base_url.replace("/w/api.php", "/wiki/Main_Page")
        [observation] = play(WikipediaTool(MediaWikiBackend(bad, retries=0)),
                             ["search[Dunmere]"])
    assert observation.ok is False and "HTTP 404" in observation.text


def test_stub_binds_localhost_only(corpus: Corpus) -> None:
    with pytest.raises(ValueError):
        MediaWikiStub(corpus, host="0.0.0.0")
    with MediaWikiStub(corpus) as base_url:
        assert base_url.startswith("http://127.0.0.1:")


def test_make_backend(tmp_path: Path) -> None:
    assert isinstance(make_backend(), OfflineBackend)
    assert isinstance(make_backend("offline"), WikiBackend)
    live = make_backend("http://127.0.0.1:1/w/api.php")
    assert isinstance(live, MediaWikiBackend) and live.base_url.endswith("/w/api.php")
    run(live.aclose())
    default = make_backend("mediawiki")
    assert isinstance(default, MediaWikiBackend)
    assert default.base_url == "https://en.wikipedia.org/w/api.php"
    run(default.aclose())


def test_bad_corpus_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WikiBackendError, match="does not exist"):
        OfflineBackend(tmp_path / "missing.jsonl")
    path = tmp_path / "bad.jsonl"
    path.write_text('{"title": "A", "text": "Alpha beta gamma."}\n{"name": "B"}\n')
    with pytest.raises(WikiBackendError, match="bad.jsonl:2"):
        OfflineBackend(path)
    path.write_text('{"title": "A", "text": "x y z"}\n{"title": "a", "text": "x y z"}\n')
    with pytest.raises(WikiBackendError, match="duplicate"):
        OfflineBackend(path)


# --------------------------------------------------------------------------- shipped data


def test_corpus_is_well_formed(corpus: Corpus) -> None:
    assert len(corpus.articles) >= 40
    for article in corpus.articles:
        assert article.title.strip() == article.title
        if not article.disambiguation:
            assert len(page_sentences(article.text)) >= 3, article.title


def test_questions_are_answerable_from_the_corpus(corpus: Corpus) -> None:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 12
    assert len({row["id"] for row in rows}) == len(rows)
    for row in rows:
        assert set(row) >= {"id", "question", "answer", "supporting_titles"}
        titles = row["supporting_titles"]
        assert len(titles) == 2, row["id"]
        articles = [corpus.get(title) for title in titles]
        assert all(a is not None and a[0].title == t for a, t in zip(articles, titles,
                                                                     strict=True)), row["id"]
        texts = " ".join(a[0].text for a in articles if a is not None)
        assert row["answer"] in texts or row["answer"] in titles, row["id"]
        # the first hop names the second page (bridge) or the question names both (comparison)
        if row.get("type") == "comparison":
            assert all(t in row["question"] for t in titles), row["id"]
        else:
            first = articles[0][0]
            assert titles[1] in first.text or titles[1] in row["question"], row["id"]
