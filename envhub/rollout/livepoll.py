"""Polling replicas for the live view, and recording what it sees into a run directory.

:class:`Poller` asks each URL for its figures, all at once (one slow or dead replica delays nobody: each request has
its own timeout) and turns the answers into rows (:mod:`envhub.rollout.live`). A URL is a rollout service when it
answers ``GET /status`` with a throughput snapshot, a gateway when ``/status`` is not served there and ``GET /stats``
is; the kind found is remembered, so each later poll is one request per replica. A replica that does not answer is
a ``down`` row carrying the error: the view shows it, it never raises.

:class:`Recorder` appends one JSON line per poll to ``RUN/throughput.jsonl`` (``{"t", "replicas": [rows], "total":
row}``) from a daemon thread: what ``envhub show RUN --plot`` draws. A poll costs each server one ``/status``. A
line is ~2.8 kB for one replica and ~2 kB more per further replica (figures rounded to 4 significant digits;
measured on the service tests' runs): at one poll every 5 s (the default), ~50 MB a day for one replica.

Only the standard library (``urllib``): the live view needs no HTTP client installed.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from envhub.rollout.runfile import read_records
from envhub.rollout.live import row_of, total

SERIES = "throughput.jsonl"
log = logging.getLogger("envhub.live")


def _get(url: str, token: str | None, timeout: float) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the user's own URL, http(s) only)
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:  # an answer, just not 200: its status says what the replica is
        try:
            body = json.loads(e.read() or b"null")
        except ValueError:
            body = None
        return e.code, body


def _reason(e: BaseException) -> str:
    inner = getattr(e, "reason", None)  # URLError wraps the socket's error: name that one
    e2 = inner if isinstance(inner, BaseException) else e
    return f"{type(e2).__name__}: {e2}".splitlines()[0][:200]


def poll(url: str, *, token: str | None = None, timeout: float = 2.0, kind: str | None = None) -> dict[str, Any]:
    """One replica's sample ``{url, t, kind: service|gateway|down, body | error}``; never raises. ``kind``: what the
    URL was last time (skips the guess)."""
    base = url.rstrip("/")
    t = time.time()
    if not base.startswith(("http://", "https://")):
        return {"url": url, "t": t, "kind": "down", "error": "not an http(s) URL"}
    try:
        if kind != "gateway":
            status, body = _get(base + "/status", token, timeout)
            if status == 200 and isinstance(body, dict) and "stages" in body:
                return {"url": url, "t": t, "kind": "service", "body": body}
            if status in (401, 403):
                return {"url": url, "t": t, "kind": "down", "error": f"/status answered {status}: pass --token"}
            if status != 404:
                return {"url": url, "t": t, "kind": "down", "error": f"/status answered {status}: {_detail(body)}"}
        status, body = _get(base + "/stats", token, timeout)
        if status == 200 and isinstance(body, dict) and "calls" in body:
            return {"url": url, "t": t, "kind": "gateway", "body": body}
        return {"url": url, "t": t, "kind": "down",
                "error": f"neither a rollout service (/status) nor a gateway (/stats answered {status})"}
    except Exception as e:  # refused, timed out, not JSON...: a row that says so
        return {"url": url, "t": t, "kind": "down", "error": _reason(e)}


def _detail(body: Any) -> str:
    return str(body.get("detail") if isinstance(body, dict) else body)[:200]


class Poller:
    """``Poller(urls).poll() -> (rows, total)``: every replica at once, each within ``timeout`` seconds."""

    def __init__(self, urls: list[str], *, token: str | None = None, timeout: float = 2.0):
        if not urls:
            raise ValueError("no URL to poll")
        self.urls, self.token, self.timeout = list(urls), token, timeout
        self.last: dict[str, dict[str, Any]] = {}  # url -> its previous sample (a gateway's rates; its kind)
        self._pool = ThreadPoolExecutor(max_workers=min(16, len(self.urls)), thread_name_prefix="envhub-top")

    def poll(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        def one(url: str) -> dict[str, Any]:
            prev = self.last.get(url)
            kind = prev["kind"] if prev and prev["kind"] != "down" else None
            return poll(url, token=self.token, timeout=self.timeout, kind=kind)

        samples = list(self._pool.map(one, self.urls))
        rows = [_row(s, self.last.get(s["url"])) for s in samples]
        for s in samples:
            self.last[s["url"]] = s
        return rows, total(rows)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _row(sample: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """:func:`row_of`, or a ``down`` row naming what was wrong with an answer of an unexpected shape (another
    version's server, a proxy's page): the view goes on."""
    try:
        return row_of(sample, previous)
    except Exception as e:
        return {"url": sample["url"], "t": sample["t"], "kind": "down",
                "error": f"unreadable {sample['kind']} answer: {type(e).__name__}: {e}"[:200]}


def _short(x: Any) -> Any:
    """Floats to 4 significant digits, all the way down: ``0.0006209129987837514`` is noise past the fourth digit,
    and the rounding halves a line (what a day of recording costs on disk)."""
    if isinstance(x, float):
        return float(f"{x:.4g}") if x == x else None
    if isinstance(x, dict):  # "t" (a Unix time) is kept whole: 4 digits of it would be a 15-day bin
        return {k: v if k == "t" else _short(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_short(v) for v in x]
    return x


def record_line(rows: list[dict[str, Any]], tot: dict[str, Any]) -> str:
    """One line of ``throughput.jsonl`` (the time itself is kept whole)."""
    t = tot.get("t") or time.time()
    return json.dumps({"t": t, "replicas": _short(rows), "total": _short(tot)}, default=str,
                      separators=(",", ":")) + "\n"


class Recorder:
    """Append the figures of ``urls`` to ``run_dir/throughput.jsonl`` every ``interval_s`` from a daemon thread
    (``start()``/``stop()``, or ``with Recorder(...):``). Each line is written whole and flushed: a kill leaves at
    most a partial last line, which readers skip."""

    def __init__(self, run_dir: str | Path, urls: list[str], *, interval_s: float = 5.0, token: str | None = None,
                 timeout: float = 2.0):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.path = Path(run_dir) / SERIES
        self.poller = Poller(urls, token=token, timeout=timeout)
        self.interval_s = interval_s
        self.lines = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, rows: list[dict[str, Any]] | None = None, tot: dict[str, Any] | None = None) -> None:
        """Poll (unless given the rows) and append one line."""
        if rows is None or tot is None:
            rows, tot = self.poller.poll()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(record_line(rows, tot))
        self.lines += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.record()
            except Exception as e:  # a full disk must not end the recording, nor the run; the next poll tries again
                log.warning("throughput recorder: %s: %s (%s)", type(e).__name__, e, self.path)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def start(self) -> "Recorder":
        self._thread = threading.Thread(target=self._loop, name="envhub-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poller.timeout + 5)
        self.poller.close()

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def read_series(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a ``throughput.jsonl`` (a run directory or the file); a partial last line is skipped."""
    return [d for d in read_records(path, SERIES) if isinstance(d, dict) and isinstance(d.get("total"), dict)]
