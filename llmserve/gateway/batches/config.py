"""The gateway's state folder and Batch API settings (``state:`` and ``batches:`` in gateway.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


DEFAULT_STATE_DIR = Path("~/.cache/llmserve/state")


class StateConfig(BaseModel):
    """Where what must survive a restart lives: batches, their files, stored responses;
    and, with ``redis_url``, what gateway replicas share (llmserve/state)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dir: Path = DEFAULT_STATE_DIR  # unset: a folder per gateway port (for_port)
    # Unset: one process, everything in memory (or in ``dir``) as before.
    redis_url: str | None = None
    redis_password_file: Path | None = None  # when the URL carries no password
    # Gateway replicas sharing the store: while it is unreachable each enforces 1/replicas
    # of every key's limits alone (gateway/tenants/limiter.py).
    replicas: int = Field(1, ge=1)
    # Instances: listed in the config (own), or started by this replica's controller and
    # published (publish), or mirrored from the replica that does (follow): serve --replicas.
    pools: Literal["own", "publish", "follow"] = "own"

    @model_validator(mode="after")
    def _shared_pools_need_the_store(self) -> StateConfig:
        if self.pools != "own" and self.redis_url is None:
            raise ValueError(f"state.pools: {self.pools} needs state.redis_url (the replicas' store)")
        return self

    def for_port(self, port: int) -> StateConfig:
        """This deployment's own folder unless ``dir`` was given: ``DEFAULT_STATE_DIR/port-<port>``.
        Two gateways on one machine sharing one would share batches (and the lock that lets one
        of them run them all, with its own models), stored responses and instance registries."""
        if "dir" in self.model_fields_set:
            return self
        return self.model_copy(update={"dir": DEFAULT_STATE_DIR / f"port-{port}"})

    def path(self, name: str) -> Path:
        return self.dir.expanduser() / name


class BatchShareConfig(BaseModel):
    """Lines per ready instance that follow the realtime forecast (batches/share.py): ``trough``
    while the forecast realtime load is at most ``trough_load`` of the ready pool, ``peak`` from
    ``peak_load`` on, in proportion between."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # None: each ready instance's batch room, its seats less the realtime reserve (8 - 2 = 6 for
    # an 8-seat instance; share.batch_room)
    trough: int | None = Field(None, ge=1)
    peak: int = Field(0, ge=0)  # 0: none (one line for all batches still runs, to measure the pace)
    trough_load: float = Field(0.1, ge=0.0)
    # the predictive pool runs realtime at ~0.75 of its capacity at the peak: no batch seat there
    peak_load: float = Field(0.75, gt=0.0)

    @model_validator(mode="after")
    def _ordered(self) -> BatchShareConfig:
        if self.trough is not None and self.peak > self.trough:
            raise ValueError("batches.share: peak must not exceed trough")
        if self.peak_load <= self.trough_load:
            raise ValueError("batches.share: peak_load must exceed trough_load")
        return self


UPLOAD_ENVELOPE_BYTES = 64 << 10


class BatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_file_bytes: int = Field(64 << 20, ge=1024)  # an uploaded file (OpenAI allows 200 MB)
    max_lines: int = Field(50_000, ge=1)  # per input file, OpenAI's cap
    # one key's files together (uploads and its batches' outputs): an upload past it is refused,
    # so one key cannot fill the state folder's disk for every other (delete files to make room)
    max_key_bytes: int = Field(8 << 30, ge=1024)
    # lines in flight per ready instance (all batches together), so a bigger pool's idle seats fill too:
    # on one instance 4 kept realtime TTFT p90 at 1.5x idle, 16 let it reach 2.7x
    # (benchmarks/batches/README.md); over a simulated day 2 per instance cost the fewest
    # instance-hours (benchmarks/sim/README.md); admission queues any excess behind realtime
    concurrency: int = Field(2, ge=1)
    # with the predictive policy, lines per ready instance follow its forecast instead (None: off):
    # over the simulated day realtime attainment as alone's at 2,000 to 20,000 lines (benchmarks/sim/README.md)
    share: BatchShareConfig | None = BatchShareConfig()
    max_concurrency: int = Field(64, ge=1)  # for a batch that would miss its window (batches/pace.py)
    retry_interval_s: float = Field(1.0, gt=0.0)  # after a 429 / 503: the pool is full, try again
    poll_interval_s: float = Field(0.5, gt=0.0)  # how often the runner looks for new work

    @property
    def upload_body_bytes(self) -> int:
        """A ``POST /v1/files`` body's cap: the file's limit plus the multipart envelope
        (boundaries, part headers, filename, purpose), which is not the file; the route holds
        the file itself to ``max_file_bytes``."""
        return self.max_file_bytes + UPLOAD_ENVELOPE_BYTES
