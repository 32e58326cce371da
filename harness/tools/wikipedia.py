"""The ReAct paper's Wikipedia environment: `search[entity]`, `lookup[keyword]`, `finish[answer]`.

Observations follow the paper's environment so that its prompts and few-shot trajectories work
unchanged:

* ``search[X]`` on a page that exists: the first five sentences of the page, joined by spaces
  (paragraphs of at most two words, i.e. headings, are dropped first). The page becomes the
  current page and the lookup state is reset.
* ``search[X]`` with no such page (or a disambiguation page): ``Could not find X. Similar:
  ['A', 'B', ...].`` with up to five titles from a full-text search, as a Python list.
* ``lookup[K]``: the sentences of the current page containing K (case-insensitive), one per
  call, as ``(Result i / n) sentence``; past the last one (or with no page), ``No more
  results.``. A different keyword starts over.
* ``finish[answer]``: ends the episode (``done=True``, ``answer`` set). Later calls repeat it.

One deliberate difference: the paper splits sentences on ``". "`` and appends a period to every
piece, so sentences that end a paragraph come out with two periods; here a period is added only
where a sentence lacks final punctuation.

Two backends sit behind :class:`WikiBackend`: :class:`MediaWikiBackend` (the live MediaWiki API
over httpx, retries with backoff) and :class:`OfflineBackend` (a JSONL corpus with a small BM25
search, shipped in ``datasets/wikipedia/articles.jsonl``). ``harness.tools.mediawiki_stub``
serves the offline corpus through the MediaWiki API shapes, so the live client is tested too.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from harness.tools.base import Observation, Tool

DEFAULT_API_URL = "https://en.wikipedia.org/w/api.php"
DEFAULT_CORPUS = (
    Path(__file__).resolve().parents[2] / "datasets" / "wikipedia" / "articles.jsonl"
)
SIMILAR_SHOWN = 5
SEARCH_LIMIT = 10
PAGE_SENTENCES = 5
DISAMBIGUATION_MARK = "may refer to:"
USER_AGENT = "harness/0.1 (ReAct Wikipedia tool; research use)"


# --------------------------------------------------------------------------- backend interface

@dataclass(frozen=True)
class SearchResult:
    """The page a search landed on: its title and its full plain text."""

    title: str
    text: str


@dataclass(frozen=True)
class Similar:
    """No page of that name: titles a full-text search suggests instead (best first)."""

    titles: list[str] = field(default_factory=list)


class WikiBackendError(RuntimeError):
    """The backend could not answer (server unreachable, bad response, unreadable corpus)."""


@runtime_checkable
class WikiBackend(Protocol):
    async def search(self, query: str) -> SearchResult | Similar: ...

    async def aclose(self) -> None: ...


def normalize_title(title: str) -> str:
    """The key two titles are the same under: case, underscores and spacing ignored."""
    return " ".join(title.replace("_", " ").split()).casefold()


def is_disambiguation(text: str) -> bool:
    head = text.strip().split("\n", 1)[0]
    return DISAMBIGUATION_MARK in head


# --------------------------------------------------------------------------- page text

def page_paragraphs(text: str) -> list[str]:
    """Paragraphs as the paper's environment keeps them: non-empty, more than two words."""
    paragraphs = (p.strip() for p in text.split("\n"))
    return [p for p in paragraphs if p and len(p.split(" ")) > 2]


def page_sentences(text: str) -> list[str]:
    sentences: list[str] = []
    for paragraph in page_paragraphs(text):
        for piece in paragraph.split(". "):
            piece = piece.strip()
            if piece:
                sentences.append(piece if piece[-1] in ".!?" else piece + ".")
    return sentences


def page_summary(text: str) -> str:
    return " ".join(page_sentences(text)[:PAGE_SENTENCES])


# --------------------------------------------------------------------------- offline corpus

_TOKEN = re.compile(r"[0-9a-z]+")
_STOPWORDS = frozenset(
    "a an and are as at be by for from has he her his in is it its of on or she that the their "
    "they this to was were which who with".split()
)


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.casefold()) if t not in _STOPWORDS]


@dataclass(frozen=True)
class Article:
    title: str
    text: str
    aliases: tuple[str, ...] = ()

    @property
    def disambiguation(self) -> bool:
        return is_disambiguation(self.text)


@dataclass(frozen=True)
class Hit:
    """A ranked search result; `via` is the alias (redirect) that matched, if any."""

    title: str
    score: float
    via: str | None = None


class Corpus:
    """Articles by title with BM25 search over title (weighted) and text."""

    TITLE_WEIGHT = 3
    K1 = 1.2
    B = 0.75

    def __init__(self, articles: Iterable[Article]) -> None:
        self.articles: list[Article] = []
        self._by_key: dict[str, tuple[Article, str | None]] = {}
        for article in articles:
            key = normalize_title(article.title)
            if key in self._by_key and self._by_key[key][1] is None:
                raise WikiBackendError(f"duplicate article title {article.title!r}")
            self.articles.append(article)
            self._by_key[key] = (article, None)
        for article in self.articles:
            for alias in article.aliases:
                self._by_key.setdefault(normalize_title(alias), (article, alias))
        self._docs: list[Counter[str]] = []
        for article in self.articles:
            terms = Counter(tokenize(article.text))
            names = tokenize(" ".join((article.title, *article.aliases)))
            for term in names:
                terms[term] += self.TITLE_WEIGHT
            self._docs.append(terms)
        self._lengths = [sum(doc.values()) for doc in self._docs]
        self._avg_length = sum(self._lengths) / max(1, len(self._lengths))
        df: Counter[str] = Counter()
        for doc in self._docs:
            df.update(doc.keys())
        n = len(self._docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CORPUS) -> Corpus:
        path = Path(path)
        if not path.is_file():
            raise WikiBackendError(f"Wikipedia corpus {path} does not exist")
        articles = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                articles.append(Article(str(row["title"]), str(row["text"]),
                                        tuple(str(a) for a in row.get("aliases", ()))))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise WikiBackendError(
                    f"{path}:{number}: expected a JSON object with 'title' and 'text' ({exc})"
                ) from None
        return cls(articles)

    def get(self, title: str) -> tuple[Article, str | None] | None:
        """The article a title or alias names (case, underscores and spacing ignored)."""
        return self._by_key.get(normalize_title(title))

    def rank(self, query: str, limit: int = SEARCH_LIMIT) -> list[Hit]:
        terms = tokenize(query)
        key = normalize_title(query)
        hits: list[Hit] = []
        for article, doc, length in zip(self.articles, self._docs, self._lengths, strict=True):
            score = 0.0
            for term in terms:
                tf = doc.get(term, 0)
                if tf:
                    norm = tf + self.K1 * (1 - self.B + self.B * length / self._avg_length)
                    score += self._idf[term] * tf * (self.K1 + 1) / norm
            via = None
            if key == normalize_title(article.title):
                score += 1000.0
            else:
                for alias in article.aliases:
                    if key == normalize_title(alias):
                        score += 1000.0
                        via = alias
                        break
            if score > 0:
                hits.append(Hit(article.title, score, via))
        hits.sort(key=lambda h: (-h.score, h.title))
        return hits[:limit]


class OfflineBackend:
    """Search a local JSONL corpus: exact (normalized) title or alias, else similar titles."""

    def __init__(self, corpus: Corpus | str | Path | None = None) -> None:
        if isinstance(corpus, Corpus):
            self.corpus = corpus
        else:
            self.corpus = Corpus.load(corpus if corpus is not None else DEFAULT_CORPUS)

    def search_sync(self, query: str) -> SearchResult | Similar:
        found = self.corpus.get(query)
        if found is not None and not found[0].disambiguation:
            return SearchResult(found[0].title, found[0].text)
        exclude = found[0].title if found is not None else None
        return Similar([h.title for h in self.corpus.rank(query) if h.title != exclude])

    async def search(self, query: str) -> SearchResult | Similar:
        return self.search_sync(query)

    async def aclose(self) -> None:
        return None


# --------------------------------------------------------------------------- MediaWiki API

@dataclass(frozen=True)
class _Page:
    title: str
    text: str
    disambiguation: bool


class MediaWikiBackend:
    """The MediaWiki Action API (Wikipedia by default), as the ReAct environment's search.

    A search first asks for the page of that title (following redirects); if there is none, a
    full-text search (`list=search`) either finds a result whose title or redirect is the query
    up to case, or gives the similar titles. Disambiguation pages count as not found. Transport
    errors, timeouts, 429 and 5xx are retried with exponential backoff; then a
    :class:`WikiBackendError` says the API is unreachable.
    """

    def __init__(self, base_url: str = DEFAULT_API_URL, *, timeout: float = 10.0,
                 retries: int = 3, backoff: float = 0.5,
                 client: httpx.AsyncClient | None = None,
                 user_agent: str = USER_AGENT) -> None:
        self.base_url = base_url
        self.retries = retries
        self.backoff = backoff
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), headers={"User-Agent": user_agent},
            follow_redirects=True,
        )

    async def _get(self, params: dict[str, str]) -> dict[str, Any]:
        query = {"format": "json", "formatversion": "2", **params}
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await self._client.get(self.base_url, params=query)
            except httpx.TransportError as exc:  # connect/read errors and timeouts
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if response.status_code == 429 or response.status_code >= 500:
                problem = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise WikiBackendError(f"MediaWiki API at {self.base_url} answered HTTP "
                                       f"{response.status_code}")
            try:
                data = response.json()
            except ValueError:
                raise WikiBackendError(f"MediaWiki API at {self.base_url} did not answer "
                                       "JSON; is the URL an api.php endpoint?") from None
            if not isinstance(data, dict):
                raise WikiBackendError(f"MediaWiki API at {self.base_url}: unexpected answer")
            if "error" in data:
                error = data["error"] or {}
                raise WikiBackendError(f"MediaWiki API error {error.get('code', '?')}: "
                                       f"{error.get('info', '')}")
            return data
        raise WikiBackendError(f"MediaWiki API at {self.base_url} is unreachable after "
                               f"{self.retries + 1} attempt(s) ({problem})")

    async def _page(self, title: str) -> _Page | None:
        data = await self._get({
            "action": "query", "prop": "extracts|pageprops", "explaintext": "1",
            "exsectionformat": "plain", "ppprop": "disambiguation", "redirects": "1",
            "titles": title,
        })
        for page in data.get("query", {}).get("pages", []):
            if page.get("missing") or page.get("invalid") or "extract" not in page:
                continue
            text = str(page.get("extract") or "")
            disambiguation = "disambiguation" in (page.get("pageprops") or {})
            return _Page(str(page["title"]), text, disambiguation or is_disambiguation(text))
        return None

    async def _search(self, query: str) -> list[tuple[str, str | None]]:
        data = await self._get({
            "action": "query", "list": "search", "srsearch": query,
            "srlimit": str(SEARCH_LIMIT), "srprop": "redirecttitle", "srnamespace": "0",
        })
        return [(str(hit["title"]), hit.get("redirecttitle"))
                for hit in data.get("query", {}).get("search", [])]

    async def search(self, query: str) -> SearchResult | Similar:
        if not query.strip():
            return Similar([])
        page = await self._page(query)
        hits: list[tuple[str, str | None]] | None = None
        if page is None:
            hits = await self._search(query)
            key = normalize_title(query)
            for title, redirect in hits:
                if key in (normalize_title(title), normalize_title(redirect or "")):
                    page = await self._page(title)
                    break
            if page is None:
                return Similar([title for title, _ in hits])
        if page.disambiguation:
            hits = hits if hits is not None else await self._search(query)
            return Similar([title for title, _ in hits if title != page.title])
        return SearchResult(page.title, page.text)

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()


def make_backend(spec: str | None = None) -> WikiBackend:
    """`None`/"offline" -> the shipped corpus; "mediawiki" -> Wikipedia; a URL -> that API;
    a path to a .jsonl file -> that corpus."""
    if spec is None or spec == "offline":
        return OfflineBackend()
    if spec == "mediawiki":
        return MediaWikiBackend()
    if spec.startswith(("http://", "https://")):
        return MediaWikiBackend(spec)
    return OfflineBackend(Path(spec))


# --------------------------------------------------------------------------- the tool

_ACTION = re.compile(r"^\s*([A-Za-z]+)\s*\[(.*)\]\s*$", re.DOTALL)
ACTIONS = ("search", "lookup", "finish", "think")


class WikipediaTool(Tool):
    """One program's Wikipedia session: the current page, the lookup cursor and the answer."""

    name = "wikipedia"
    description = (
        "search[entity] shows the first sentences of the Wikipedia page of entity, or similar "
        "titles if it does not exist; lookup[keyword] shows the next sentence containing "
        "keyword on the current page; finish[answer] gives the final answer."
    )

    def __init__(self, backend: WikiBackend | None = None) -> None:
        self.backend: WikiBackend = backend if backend is not None else OfflineBackend()
        self.title: str | None = None
        self.page: str | None = None
        self.lookup_keyword: str | None = None
        self.lookup_list: list[str] = []
        self.lookup_cnt = 0
        self.answer: str | None = None
        self.steps = 0
        self._closed = False

    def actions(self) -> dict[str, Callable[[str], Awaitable[Observation]]]:
        """Per-action callables (`search`, `lookup`, `finish`) for a ReAct tool box."""

        def bind(action: str) -> Callable[[str], Awaitable[Observation]]:
            async def call(argument: str) -> Observation:
                return await self.run_action(action, argument)

            return call

        return {action: bind(action) for action in ("search", "lookup", "finish")}

    async def run(self, argument: str) -> Observation:
        """`argument` is a whole action, e.g. ``search[Dunmere]``."""
        match = _ACTION.match(argument or "")
        if match is None:
            return self._invalid(argument)
        return await self.run_action(match.group(1), match.group(2))

    async def run_action(self, action: str, argument: str) -> Observation:
        action = action.strip().lower()
        if self.answer is not None:
            return self._finished()
        if action not in ACTIONS:
            return self._invalid(f"{action}[{argument}]")
        self.steps += 1
        argument = argument.strip()
        if action == "search":
            return await self._search(argument)
        if action == "lookup":
            return self._lookup(argument)
        if action == "finish":
            self.answer = argument
            return self._finished()
        return Observation("Nice thought.", info={"action": "think"})

    async def _search(self, entity: str) -> Observation:
        if not entity:
            return Observation("Invalid action: search[] needs an entity, e.g. search[Dunmere].",
                               ok=False, info={"action": "search"})
        try:
            result = await self.backend.search(entity)
        except WikiBackendError as exc:
            return Observation(f"Wikipedia search failed: {exc}", ok=False,
                               info={"action": "search", "error": str(exc)})
        if isinstance(result, Similar):
            shown = list(result.titles[:SIMILAR_SHOWN])
            return Observation(f"Could not find {entity}. Similar: {shown}.",
                               info={"action": "search", "similar": shown})
        self.title = result.title
        self.page = "\n".join(page_paragraphs(result.text))
        self.lookup_keyword = None
        self.lookup_list = []
        self.lookup_cnt = 0
        return Observation(page_summary(self.page), info={"action": "search", "title": self.title})

    def _lookup(self, keyword: str) -> Observation:
        if not keyword:
            return Observation("Invalid action: lookup[] needs a keyword, e.g. lookup[river].",
                               ok=False, info={"action": "lookup"})
        if keyword != self.lookup_keyword:
            self.lookup_keyword = keyword
            needle = keyword.lower()
            sentences = page_sentences(self.page) if self.page is not None else []
            self.lookup_list = [s for s in sentences if needle in s.lower()]
            self.lookup_cnt = 0
        info: dict[str, Any] = {"action": "lookup", "title": self.title}
        if self.lookup_cnt >= len(self.lookup_list):
            return Observation("No more results.", info=info)
        text = (f"(Result {self.lookup_cnt + 1} / {len(self.lookup_list)}) "
                f"{self.lookup_list[self.lookup_cnt]}")
        self.lookup_cnt += 1
        return Observation(text, info=info)

    def _finished(self) -> Observation:
        return Observation(f"Episode finished with answer: {self.answer}", done=True,
                           answer=self.answer, info={"action": "finish", "steps": self.steps})

    @staticmethod
    def _invalid(argument: str) -> Observation:
        return Observation(f"Invalid action: {argument}. Use search[entity], lookup[keyword] "
                           "or finish[answer].", ok=False, info={"action": "invalid"})

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.backend.aclose()
