"""Small file helpers shared by the model store and the conversion cache.

Everything the store writes goes through a temporary file in the same folder and
an ``os.replace``, so a crash, a full disk or two processes pulling at once never
leave a half-written model or manifest where a reader would trust it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from contextlib import contextmanager
from typing import Any, BinaryIO, Iterator

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class AtomicFile:
    """A binary file written under a temporary name and renamed into place on success.

    Use as a context manager; on an exception the temporary file is removed and the
    destination is left as it was.
    """

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        self.tmp = Path(tmp)
        self.file: BinaryIO = os.fdopen(fd, "wb")

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                self.file.flush()
                os.fsync(self.file.fileno())
            self.file.close()
            if exc_type is None:
                os.chmod(self.tmp, 0o644)  # mkstemp makes it 0600
                os.replace(self.tmp, self.dest)
        finally:
            self.tmp.unlink(missing_ok=True)


@contextmanager
def atomic_target(dest: Path) -> Iterator[Path]:
    """A temporary path beside ``dest`` for a writer that wants a file name; renamed on success."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_bytes(dest: Path, data: bytes) -> None:
    """Write ``data`` to ``dest`` atomically."""
    with AtomicFile(dest) as f:
        f.write(data)


def atomic_write_json(dest: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``dest`` atomically."""
    atomic_write_bytes(dest, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode())


def read_json(path: Path) -> Any:
    """Read a JSON file; the caller turns ``OSError``/``ValueError`` into its own error."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_json_object(path: Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """A JSON file that must hold an object; ``error`` (the caller's kind) names ``what`` it is."""
    try:
        d = read_json(path)
    except (OSError, ValueError) as e:
        raise error(f"{path}: cannot read {what} ({e})") from e
    if not isinstance(d, dict):
        raise error(f"{path}: {what} is not a JSON object")
    return d
