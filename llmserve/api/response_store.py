"""Stored responses (``store: true``), for ``previous_response_id`` and ``GET /v1/responses/{id}``.

``ResponseStore`` is the contract a backend keeps (bounded by age and count; past the
count, the key holding the most loses its oldest: ``evicted_owner``); ``SQLiteResponseStore`` is the
default (one file in the gateway's state folder, WAL, so a restart keeps them; an
instance uses an in-memory one); with ``state.redis_url`` gateway replicas share
``llmserve.state.response_store.RedisResponseStore``, which keeps the same three calls. Each record holds the response object and
the conversation up to and including it as chat messages, so a chain of any
length is one lookup.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    owner: str  # a digest of the API key that stored it: only that key reads or deletes it
    response: dict[str, Any]  # the response object as GET returns it
    messages: list[dict[str, Any]]  # the conversation as chat messages (instructions excluded)
    created_at: float


class ResponseStore(Protocol):
    """Put is atomic (a reader sees a whole record or none); delete says whether it existed.
    Async, since a shared store is across a network; a backend that cannot be reached
    raises an ``APIError`` (503), never a bare exception."""

    async def put(self, record: StoredResponse) -> None: ...

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str) -> bool: ...


def connect(path: str | Path) -> sqlite3.Connection:
    """A WAL SQLite connection shared by the event loop's thread and worker threads."""
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
    for wait in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, None):
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            # Two processes opening a new file at once (gateway replicas on one state folder):
            # the switch into WAL can fail at once, SQLite skipping its busy wait where waiting
            # could deadlock. The other one's switch lasts milliseconds: try again.
            if "locked" not in str(e) or wait is None:
                db.close()
                raise
            time.sleep(wait)
    db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed write survives a process kill
    return db


def evicted_owner(counts: dict[str, int]) -> str:
    """Whose oldest record goes when the store is full: the key holding the most (then the
    first named), so one key's flood of stored responses evicts its own, never another
    key's ``previous_response_id`` (with one key, simply the oldest)."""
    return max(sorted(counts), key=lambda owner: counts[owner])


class SQLiteResponseStore:
    def __init__(self, path: str | Path = ":memory:", max_age_s: float = 30 * 24 * 3600,
                 max_records: int = 100_000) -> None:
        self._db = connect(path)
        self._lock = threading.Lock()
        self.max_age_s = max_age_s  # OpenAI keeps stored responses 30 days
        self.max_records = max_records  # past it the heaviest key's oldest go (evicted_owner)
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
                         "response TEXT NOT NULL, messages TEXT NOT NULL, created_at REAL NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_owner ON responses (owner, created_at)")

    async def put(self, record: StoredResponse) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                             (record.id, record.owner, json.dumps(record.response), json.dumps(record.messages),
                              record.created_at))
            self._db.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.max_age_s,))
            (count,) = self._db.execute("SELECT COUNT(*) FROM responses").fetchone()
            for _ in range(count - self.max_records):
                counts = dict(self._db.execute("SELECT owner, COUNT(*) FROM responses GROUP BY owner").fetchall())
                self._db.execute("DELETE FROM responses WHERE id = (SELECT id FROM responses WHERE owner = ? "
                                 "ORDER BY created_at LIMIT 1)", (evicted_owner(counts),))

    async def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute("SELECT id, owner, response, messages, created_at FROM responses WHERE id = ?",
                                   (response_id,)).fetchone()
        if row is None:
            return None
        return StoredResponse(row[0], row[1], json.loads(row[2]), json.loads(row[3]), row[4])

    async def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
