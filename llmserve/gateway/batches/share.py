"""The batch's share of seats: the full batch room in the trough, little while realtime climbs or peaks.

Pure. A batch line holds a seat for the whole ~45 s of its generation, so lines
started while the realtime load climbs or is near its peak are still there when a
realtime burst arrives, and the burst waits at the gateway for a seat (the gateway
never sends an instance more than its seats; ``benchmarks/sim/README.md``, "Why
realtime attainment falls"). What decides is the realtime load *ahead*, not now:
the predictive policy's own forecast over its lead time, in instances
(:func:`llmserve.autoscale.outlook.realtime_load`), over the ready instances. At or
under ``trough_load`` of the pool each ready instance gets ``trough`` lines (default: its
batch room, the seats it reports less the realtime reserve, :func:`batch_room`); at or over ``peak_load``,
``peak``; in between, in proportion. The window still comes first: the pace rule
widens the release and tells the autoscaler the need when this share falls short
of the window (:mod:`llmserve.gateway.batches.pace`), so the share only moves work
from the busy hours to the idle ones, it never lets a batch miss its window.

No forecast (another policy, or none measured yet): the plain ``concurrency``
per ready instance, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmserve.gateway.admission import ConcurrencyConfig, batch_limit, seats_target
from llmserve.gateway.batches.config import BatchShareConfig
from llmserve.gateway.batches.pace import base_in_flight


def lines_per_instance(load_instances: float | None, ready_instances: int, plain: int, trough: int, peak: int,
                       trough_load: float, peak_load: float) -> int:
    """Batch lines per ready instance for a forecast realtime load of ``load_instances``
    (instances' worth of saturation throughput; None: no forecast, ``plain``)."""
    if load_instances is None:
        return plain
    u = load_instances / max(ready_instances, 1)  # the share of the ready pool realtime will take
    if u <= trough_load:
        return trough
    if u >= peak_load:
        return peak
    return round(trough + (peak - trough) * (u - trough_load) / (peak_load - trough_load))


def batch_room(instances: Iterable[tuple[int, ConcurrencyConfig]]) -> int:
    """A ready instance's batch room, on the mean over the ready ones, each given as (the
    ``max_num_seqs`` it reports, 0 where unknown; its pool's ``concurrency``): the requests the
    gateway lets it hold less the realtime reserve. An 8-seat instance at the defaults: 8 - 2 = 6."""
    rooms = [batch_limit(seats_target(n, c), c) for n, c in instances]
    if not rooms:  # none ready: what an instance of unknown seats would get
        c = ConcurrencyConfig()
        return batch_limit(seats_target(0, c), c)
    return max(1, sum(rooms) // len(rooms))


def base_lines(share: BatchShareConfig | None, plain: int, ceiling: int, load_instances: float | None,
               ready_instances: int, room: int) -> int:
    """The lines in flight for all batches before any window widens them: ``plain``
    (``batches.concurrency``) or the share per ready instance, up to ``ceiling``. ``room``:
    a ready instance's batch room (:func:`batch_room`), the share's trough unless it names one."""
    if share is None:
        return base_in_flight(plain, ready_instances, ceiling)
    trough = share.trough if share.trough is not None else room
    per = lines_per_instance(load_instances, ready_instances, plain, trough, min(share.peak, trough),
                             share.trough_load, share.peak_load)
    return base_in_flight(per, ready_instances, ceiling)
