"""The local provider's own listing: which instance processes run, on disk.

With replicas, an instance outlives the leader that started it, so the next
leader must find it: each start writes one JSON file (instance id, pool, pid,
the process's start time, port, URL, log and the fencing token of the leader
that asked), each stop removes it. A pid alone could be reused by an unrelated
process once ours is gone, so a process is ours only while ``/proc`` shows the
same pid with the same start time (:func:`process_start`).

:class:`AdoptedProcess` lets a provider stop and watch a process it did not
fork (its parent was the old leader), with the ``poll``/``send_signal``/``kill``
of a ``Popen``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22);
    None when there is no such live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass(frozen=True, slots=True)
class Registered:
    instance_id: str
    pool: str
    pid: int
    started: int  # process_start(pid) when it was registered
    port: int
    url: str
    log: str
    token: int | None = None  # the fencing token of the leader that started or adopted it

    def alive(self) -> bool:
        return process_start(self.pid) == self.started


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class ProcessRegistry:
    """A folder of one file per running instance; shared by the replicas on one machine."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, instance_id: str) -> Path:
        return self.folder / f"{_safe(instance_id)}.json"

    def record(self, entry: Registered) -> None:
        """Write atomically (a new file renamed over the old): a reader never sees half of one."""
        path = self._path(entry.instance_id)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(entry)))
        os.replace(tmp, path)

    def remove(self, instance_id: str) -> None:
        self._path(instance_id).unlink(missing_ok=True)

    def entries(self, pool: str | None = None) -> list[Registered]:
        out = []
        for p in sorted(self.folder.glob("*.json")):
            try:
                entry = Registered(**json.loads(p.read_text()))
            except (OSError, ValueError, TypeError):
                continue  # being replaced, or not ours: never executed, only read
            if pool is None or entry.pool == pool:
                out.append(entry)
        return out

    def live(self, pool: str | None = None) -> list[Registered]:
        """Entries whose process still runs; the others are removed."""
        out = []
        for entry in self.entries(pool):
            if entry.alive():
                out.append(entry)
            else:
                self.remove(entry.instance_id)
        return out


class AdoptedProcess:
    """A registered process this provider did not start: watched and signalled by pid."""

    def __init__(self, entry: Registered) -> None:
        self.entry = entry
        self.pid = entry.pid
        self.returncode: int | None = None  # not our child: its exit code cannot be read

    def poll(self) -> int | None:
        return None if self.entry.alive() else -1

    def send_signal(self, sig: int) -> None:
        if self.entry.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return self.poll()
