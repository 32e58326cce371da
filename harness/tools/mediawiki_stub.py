"""A local MediaWiki API server backed by the offline corpus, for tests and offline demos.

It answers the two requests :class:`~harness.tools.wikipedia.MediaWikiBackend` makes, in the
JSON shapes of the real API (``format=json&formatversion=2``):

* ``action=query&prop=extracts|pageprops&titles=T&redirects=1`` -> ``query.pages`` with the
  page's ``extract`` (plain text), ``pageprops.disambiguation`` for disambiguation pages,
  ``missing: true`` otherwise; ``query.normalized`` / ``query.redirects`` as MediaWiki reports
  title normalization (underscores, first letter upper case) and redirects (article aliases).
  Like MediaWiki, titles match exactly apart from the first letter.
* ``action=query&list=search&srsearch=Q`` -> ``query.search``: the corpus's BM25 ranking, with
  ``redirecttitle`` when an alias matched.

Anything else gets a MediaWiki-style ``{"error": {...}}``. It binds 127.0.0.1 only::

    with MediaWikiStub() as base_url:          # e.g. http://127.0.0.1:41234/w/api.php
        backend = MediaWikiBackend(base_url)

``fail_first=n`` answers the first n requests with HTTP 503 and ``delay`` sleeps before each
answer, to exercise the client's retries and timeouts. ``python -m harness.tools.mediawiki_stub
--port 8089`` serves until interrupted: a server process of its own that `harness eval load`
starts (so its memory is not the harness's), hence its own small ``__main__`` rather than a
`harness` subcommand, which would make a tool depend on the command line above it.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from harness.tools.wikipedia import DEFAULT_CORPUS, SEARCH_LIMIT, Corpus

API_PATH = "/w/api.php"


def _mediawiki_title(title: str) -> str:
    """MediaWiki's own normalization: underscores to spaces, trimmed, first letter upper."""
    text = " ".join(title.replace("_", " ").split())
    return text[:1].upper() + text[1:]


class MediaWikiStub:
    def __init__(self, corpus: Corpus | str | Path | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, fail_first: int = 0, delay: float = 0.0) -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError("the MediaWiki stub binds 127.0.0.1 only")
        self.corpus = corpus if isinstance(corpus, Corpus) else Corpus.load(
            corpus if corpus is not None else DEFAULT_CORPUS)
        self.host = "127.0.0.1"
        self.port = port
        self.fail_first = fail_first
        self.delay = delay
        self.requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._exact = {a.title: a for a in self.corpus.articles}
        self._redirects = {_mediawiki_title(alias): a for a in self.corpus.articles
                           for alias in a.aliases}
        self._ids = {a.title: number for number, a in enumerate(self.corpus.articles, start=1)}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the stub is not running; use start() or a with block")
        return f"http://{self.host}:{self._server.server_address[1]}{API_PATH}"

    def start(self) -> str:
        if self._server is None:
            stub = self

            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    stub._handle(self)

                def log_message(self, format: str, *args: Any) -> None:
                    return None

            self._server = ThreadingHTTPServer((self.host, self.port), Handler)
            self._server.daemon_threads = True
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            kwargs={"poll_interval": 0.05},
                                            name="mediawiki-stub", daemon=True)
            self._thread.start()
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = None
            self._thread = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- requests

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        url = urlsplit(request.path)
        params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._lock:
            self.requests.append(params)
            failing = self.fail_first > 0
            if failing:
                self.fail_first -= 1
        if self.delay:
            time.sleep(self.delay)
        if url.path != API_PATH:
            self._send(request, 404, {"error": {"code": "notfound", "info": "no such path"}})
            return
        if failing:
            self._send(request, 503, {"error": {"code": "unavailable",
                                                "info": "injected failure"}})
            return
        self._send(request, 200, self.answer(params))

    def answer(self, params: dict[str, str]) -> dict[str, Any]:
        """The JSON body for one API request (public so it can be tested without HTTP)."""
        if params.get("action") != "query":
            return _error("badvalue", f"Unrecognized value for parameter \"action\": "
                                      f"{params.get('action', '')}.")
        if params.get("list") == "search":
            return self._search(params)
        if "titles" in params:
            return self._pages(params)
        return _error("invalidparammix", "Provide titles or list=search.")

    def _pages(self, params: dict[str, str]) -> dict[str, Any]:
        query: dict[str, Any] = {}
        normalized, redirects, pages = [], [], []
        follow = params.get("redirects") is not None
        props = set(params.get("prop", "").split("|"))
        for raw in params["titles"].split("|"):
            title = _mediawiki_title(raw)
            if not title:
                pages.append({"title": raw, "invalidreason": "The requested page title is "
                              "empty or contains only the name of a namespace.",
                              "invalid": True})
                continue
            if title != raw:
                normalized.append({"fromencoded": False, "from": raw, "to": title})
            article = self._exact.get(title)
            if article is None and follow and title in self._redirects:
                article = self._redirects[title]
                redirects.append({"from": title, "to": article.title})
            if article is None:
                pages.append({"ns": 0, "title": title, "missing": True})
                continue
            page: dict[str, Any] = {"pageid": self._ids[article.title], "ns": 0,
                                    "title": article.title}
            if "extracts" in props:
                page["extract"] = article.text
            if "pageprops" in props and article.disambiguation:
                page["pageprops"] = {"disambiguation": ""}
            pages.append(page)
        if normalized:
            query["normalized"] = normalized
        if redirects:
            query["redirects"] = redirects
        query["pages"] = pages
        return {"batchcomplete": True, "query": query}

    def _search(self, params: dict[str, str]) -> dict[str, Any]:
        try:
            limit = max(1, min(500, int(params.get("srlimit", SEARCH_LIMIT))))
        except ValueError:
            return _error("badinteger", "Invalid value for parameter \"srlimit\".")
        text = params.get("srsearch", "")
        if not text.strip():
            return _error("nosrsearch", "The \"srsearch\" parameter must be set.")
        hits = self.corpus.rank(text, limit)
        results = []
        for hit in hits:
            row: dict[str, Any] = {"ns": 0, "title": hit.title, "pageid": self._ids[hit.title]}
            if hit.via is not None:
                row["redirecttitle"] = hit.via
            results.append(row)
        return {"batchcomplete": True,
                "query": {"searchinfo": {"totalhits": len(hits)}, "search": results}}

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode("utf-8")
        request.send_response(status)
        request.send_header("Content-Type", "application/json; charset=utf-8")
        request.send_header("Content-Length", str(len(payload)))
        try:
            request.end_headers()
            request.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer


def _error(code: str, info: str) -> dict[str, Any]:
    return {"error": {"code": code, "info": info}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    args = parser.parse_args(argv)
    stub = MediaWikiStub(args.corpus, port=args.port)
    print(f"MediaWiki stub serving {args.corpus} at {stub.start()}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        stub.stop()


if __name__ == "__main__":
    main()
