"""The Batch API's durable state: one SQLite file (WAL) in the gateway's state folder.

Every line of a batch is a row, ``pending`` until its result is written in the same
statement that moves it to ``done`` or ``failed`` (``WHERE state = 'pending'``), so a
line has at most one result however often it was sent; the output and error files
are built from those rows when the batch ends, in the transaction that ends it.
That is the exactly-once rule: a gateway killed at any point restarts with every
accepted batch, every finished line, and the pending lines still pending.
Files and batches belong to the key that made them (a digest, never the key).
The methods block (SQLite): the routes and the runner call them in a thread.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llmserve.api.response_store import connect
from llmserve.gateway.batches.lines import Line

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL,
    filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, obj TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT,
    request TEXT, state TEXT NOT NULL, result TEXT, PRIMARY KEY (batch_id, idx));
CREATE INDEX IF NOT EXISTS lines_pending ON lines (batch_id, state);
"""
ACTIVE = ("in_progress", "cancelling")
UNRUN = {  # the error a line not run gets when its batch ends so (OpenAI's codes)
    "expired": {"code": "batch_expired", "message": "the batch's completion window ended first"},
    "cancelled": {"code": "batch_cancelled", "message": "the batch was cancelled first"},
}


def _now() -> int:
    return int(time.time())


def file_object(row: tuple) -> dict[str, Any]:
    fid, purpose, filename, size, created = row
    return {"id": fid, "object": "file", "bytes": size, "created_at": created, "filename": filename,
            "purpose": purpose, "status": "processed", "status_details": None, "expires_at": None}


class BatchStore:
    def __init__(self, path: str | Path) -> None:
        self._db = connect(path)
        self._lock = threading.Lock()
        self._db.executescript(_SCHEMA)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # ---- files ------------------------------------------------------------------------------
    def _insert_file(self, db: Any, owner: str, purpose: str, filename: str, content: bytes) -> dict[str, Any]:
        row = (f"file-{uuid.uuid4().hex}", purpose, filename, len(content), _now())
        db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)", (row[0], owner, *row[1:], content))
        return file_object(row)

    def add_file(self, owner: str, purpose: str, filename: str, content: bytes,
                 max_owner_bytes: int | None = None) -> dict[str, Any] | None:
        """The new file's object; None (nothing stored) when it would take the owner's files,
        its uploads and its batches' outputs together, past ``max_owner_bytes``."""
        with self._tx() as db:
            if max_owner_bytes is not None:
                (held,) = db.execute("SELECT coalesce(sum(bytes), 0) FROM files WHERE owner = ?", (owner,)).fetchone()
                if held + len(content) > max_owner_bytes:
                    return None
            return self._insert_file(db, owner, purpose, filename, content)

    def get_file(self, fid: str, owner: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT id, purpose, filename, bytes, created_at FROM files WHERE id = ? AND "
                                   "owner = ?", (fid, owner)).fetchone()
        return None if row is None else file_object(row)

    def file_content(self, fid: str, owner: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT content FROM files WHERE id = ? AND owner = ?", (fid, owner)).fetchone()
        return None if row is None else bytes(row[0])

    def list_files(self, owner: str, purpose: str | None, limit: int, order: str = "desc",
                   after: str | None = None) -> list[dict[str, Any]] | None:
        """Up to ``limit`` of the owner's files by (created_at, rowid), ``order`` asc or desc, those
        past the file ``after`` only; None when ``after`` names no file of the owner's. (rowid:
        files made in one second keep the order they were made in, not their random ids'.)"""
        assert order in ("asc", "desc")
        cmp = ">" if order == "asc" else "<"
        with self._lock:
            start = (None, None) if after is None else self._db.execute(
                "SELECT created_at, rowid FROM files WHERE id = ? AND owner = ?", (after, owner)).fetchone()
            if start is None:
                return None
            rows = self._db.execute(
                "SELECT id, purpose, filename, bytes, created_at FROM files WHERE owner = ? AND (? IS NULL OR "
                f"purpose = ?) AND (? IS NULL OR created_at {cmp} ? OR (created_at = ? AND rowid {cmp} ?)) "
                f"ORDER BY created_at {order}, rowid {order} LIMIT ?",
                (owner, purpose, purpose, start[0], start[0], start[0], start[1], limit)).fetchall()
        return [file_object(r) for r in rows]

    def delete_file(self, fid: str, owner: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (fid, owner)).rowcount > 0

    # ---- batches ----------------------------------------------------------------------------
    def create_batch(self, owner: str, obj: dict[str, Any], lines: list[Line]) -> dict[str, Any]:
        """The batch and its lines in one transaction: accepted whole or not at all; a batch
        created ``failed`` gets its error file in it too."""
        with self._tx() as db:
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                       (obj["id"], owner, obj["status"], obj["created_at"], json.dumps(obj)))
            db.executemany("INSERT INTO lines VALUES (?, ?, ?, ?, ?, ?)", [
                (obj["id"], ln.index, ln.custom_id, None if ln.body is None else json.dumps(ln.body),
                 "pending" if ln.error is None else "failed",
                 None if ln.error is None else json.dumps(line_result(obj["id"], ln.index, ln.custom_id,
                                                                      error=ln.error)))
                for ln in lines])
            if obj["status"] == "failed":  # no line to run (lines.file_errors): its error file now
                self._set(db, obj["id"], "failed", **self._files(db, obj["id"], owner))
        return self.get_batch(obj["id"]) or obj

    def _counts(self, db: Any, bid: str) -> dict[str, int]:
        rows = dict(db.execute("SELECT state, count(*) FROM lines WHERE batch_id = ? GROUP BY state", (bid,)))
        return {"total": sum(rows.values()), "completed": rows.get("done", 0), "failed": rows.get("failed", 0)}

    def _usage(self, db: Any, bid: str) -> dict[str, Any]:
        """OpenAI's batch ``usage``: the tokens of the lines answered 200 so far (chat and
        completions bodies say prompt/completion tokens, responses bodies input/output; reasoning
        tokens, with a --reasoning-parser, are in either's details)."""
        def total(*paths: str) -> str:
            return "coalesce(sum(coalesce(" + ", ".join(f"json_extract(result, '$.response.body.usage.{p}')"
                                                        for p in paths) + ")), 0)"
        inp, out, cached, reasoning = db.execute(
            f"SELECT {total('prompt_tokens', 'input_tokens')}, {total('completion_tokens', 'output_tokens')}, "
            f"{total('prompt_tokens_details.cached_tokens', 'input_tokens_details.cached_tokens')}, "
            f"{total('completion_tokens_details.reasoning_tokens', 'output_tokens_details.reasoning_tokens')} "
            "FROM lines WHERE batch_id = ? AND state = 'done'", (bid,)).fetchone()
        return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": inp + out}

    def get_batch(self, bid: str, owner: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT obj, owner FROM batches WHERE id = ?", (bid,)).fetchone()
            if row is None or (owner is not None and row[1] != owner):
                return None
            obj = json.loads(row[0])  # (an ended batch keeps its usage: no lines read per look)
            return {"model": None, **obj, "request_counts": self._counts(self._db, bid),  # (model: older rows lack it)
                    "usage": obj.get("usage") or self._usage(self._db, bid)}

    def stored(self, bid: str) -> dict[str, Any] | None:
        """The batch's stored object alone (status, expires_at): no lines counted or summed,
        for the runner's look between a line's retries."""
        with self._lock:
            row = self._db.execute("SELECT obj FROM batches WHERE id = ?", (bid,)).fetchone()
        return None if row is None else json.loads(row[0])

    def list_batches(self, owner: str, limit: int, after: str | None) -> list[dict[str, Any]] | None:
        """Up to ``limit`` of the owner's batches, newest first (by created_at, then rowid: the
        order they were made in), past the batch ``after`` only; None when ``after`` names no
        batch of the owner's (a cursor that named nothing would silently restart the listing)."""
        with self._lock:
            start = (None, None) if after is None else self._db.execute(
                "SELECT created_at, rowid FROM batches WHERE id = ? AND owner = ?", (after, owner)).fetchone()
            if start is None:
                return None
            rows = self._db.execute(
                "SELECT id FROM batches WHERE owner = ? AND (? IS NULL OR created_at < ? OR (created_at = ? AND "
                "rowid < ?)) ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (owner, start[0], start[0], start[0], start[1], limit)).fetchall()
        return [b for (bid,) in rows if (b := self.get_batch(bid)) is not None]

    def _set(self, db: Any, bid: str, status: str, **fields: Any) -> None:
        obj = json.loads(db.execute("SELECT obj FROM batches WHERE id = ?", (bid,)).fetchone()[0])
        obj.update(status=status, **fields)
        db.execute("UPDATE batches SET status = ?, obj = ? WHERE id = ?", (status, json.dumps(obj), bid))

    def cancel(self, bid: str, owner: str) -> dict[str, Any] | None:
        with self._tx() as db:
            row = db.execute("SELECT status FROM batches WHERE id = ? AND owner = ?", (bid, owner)).fetchone()
            if row is not None and row[0] == "in_progress":
                self._set(db, bid, "cancelling", cancelling_at=_now())
        return self.get_batch(bid, owner) if row is not None else None

    def active(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(f"SELECT id, obj, owner FROM batches WHERE status IN {ACTIVE} "
                                    "ORDER BY created_at").fetchall()
            # the owner, for the runner only: a /v1/responses line stores its response as the batch's key would
            return [{**json.loads(obj), "request_counts": self._counts(self._db, bid), "owner": owner}
                    for bid, obj, owner in rows]

    def pending(self, bid: str, skip: set[int], limit: int) -> list[tuple[int, str, dict[str, Any]]]:
        """Pending lines in file order, those in ``skip`` (in flight) left out."""
        with self._lock:
            rows = self._db.execute("SELECT idx, custom_id, request FROM lines WHERE batch_id = ? AND "
                                    "state = 'pending' ORDER BY idx LIMIT ?", (bid, limit + len(skip))).fetchall()
        return [(i, c, json.loads(r)) for i, c, r in rows if i not in skip][:limit]

    def finish_line(self, bid: str, idx: int, ok: bool, result: dict[str, Any]) -> bool:
        """Record a line's one result; False if it already had one."""
        with self._tx() as db:
            return db.execute("UPDATE lines SET state = ?, result = ? WHERE batch_id = ? AND idx = ? AND "
                              "state = 'pending'", ("done" if ok else "failed", json.dumps(result), bid,
                                                    idx)).rowcount > 0

    def finalize(self, bid: str, status: str) -> None:
        """End a batch: ``completed``, ``cancelled`` or ``expired`` (its pending lines then fail
        with ``batch_cancelled`` / ``batch_expired``, so a result written after this, by a line
        abandoned mid-write, finds none pending); the output and error files are written in the
        same transaction."""
        with self._tx() as db:
            owner = db.execute("SELECT owner FROM batches WHERE id = ?", (bid,)).fetchone()[0]
            if status in UNRUN:
                for idx, cid in db.execute("SELECT idx, custom_id FROM lines WHERE batch_id = ? AND "
                                           "state = 'pending'", (bid,)).fetchall():
                    db.execute("UPDATE lines SET state = 'failed', result = ? WHERE batch_id = ? AND idx = ?",
                               (json.dumps(line_result(bid, idx, cid, error=UNRUN[status])), bid, idx))
            stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}[status]
            self._set(db, bid, status, finalizing_at=_now(), **{stamp: _now()}, **self._files(db, bid, owner),
                      usage=self._usage(db, bid))

    def _files(self, db: Any, bid: str, owner: str) -> dict[str, str | None]:
        """The output file (lines answered 200) and the error file (the rest), in input order."""
        files: dict[str, str | None] = {}
        for state, key in (("done", "output_file_id"), ("failed", "error_file_id")):
            results = [r for (r,) in db.execute("SELECT result FROM lines WHERE batch_id = ? AND state = ? "
                                                "ORDER BY idx", (bid, state))]
            files[key] = self._insert_file(db, owner, "batch_output", f"{bid}_{key[:-8]}.jsonl",
                                           "".join(r + "\n" for r in results).encode())["id"] if results else None
        return files


def line_result(bid: str, idx: int, custom_id: str | None, *, status: int | None = None, body: Any = None,
                error: dict[str, str] | None = None) -> dict[str, Any]:
    """One output (or error) file line, as OpenAI writes it."""
    response = None if status is None else {"status_code": status, "request_id": f"{bid}-{idx}", "body": body}
    return {"id": f"batch_req_{bid.removeprefix('batch_')}_{idx}", "custom_id": custom_id, "response": response,
            "error": error}
