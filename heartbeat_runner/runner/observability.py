"""A tick's figures into this process's metrics (core/metrics.py), counted from its result record.

Invariant: one call per tick, after it ended; labels come from bounded vocabularies (the tick's stages,
source kinds, the jobs backend's name, outcomes, alert kinds, RefreshPath and RefreshReason), never from a job's
or a source's id.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from heartbeat_runner.core.metrics import SKIPPED, metrics
from heartbeat_runner.core.records import TickStatus
from heartbeat_runner.policies.alerts import AlertKind
from heartbeat_runner.policies.trigger_shaping import HoldKind
from heartbeat_runner.runner.tick_result import COUNT_FIGURES, TickResult


def count_tick(result: TickResult, backend: str) -> None:
    """What one tick that went through did: its duration and its stages', what it sensed by source kind, what
    it triggered and reconciled on ``backend``, the path (and a build's reason) of each control table refresh."""
    m = metrics()
    m.tick_duration.observe(result.duration_s)
    for stage, seconds in result.stage_timings.items():
        if stage not in COUNT_FIGURES:
            m.stage_duration.labels(stage=stage).observe(seconds)
    sensed = Counter(sensing.target.sensor_source for sensing in result.sensed)
    # SensingOutcome.outcome without a call per source (a tick senses thousands): an error, else new data or not
    failed = {s.target.source_key: s.target.sensor_source for s in result.sensed if s.error is not None}
    new_data = Counter(s.target.sensor_source for s in result.sensed
                       if s.error is None and s.result is not None and s.result.new_data)
    errors = Counter(failed.values())
    for kind, count in sensed.items():
        m.sources_sensed.labels(kind=kind).inc(count)
        m.sources_new_data.labels(kind=kind).inc(new_data[kind])
        m.source_errors.labels(kind=kind).inc(errors[kind])
    m.note_sensing(failed, result.recovered)
    for refresh in result.refreshes:
        reason = refresh.reason
        m.control_refreshes.labels(path=refresh.path.value, reason=reason.value if reason else "").inc()
    m.jobs_triggered.labels(backend=backend).inc(len(result.triggered))
    m.jobs_completed.labels(backend=backend).inc(len(result.completed))
    m.jobs_failed.labels(backend=backend).inc(len(result.failed))
    m.trigger_errors.labels(backend=backend).inc(len(result.trigger_errors))
    for (code, fate), count in result.not_executed.items():
        m.runs_not_executed.labels(code=code, fate=fate).inc(count)
    _count_holds(result)


def _count_holds(result: TickResult) -> None:
    """The jobs a trigger hold kept back this tick, by hold kind (every kind shown, 0 when none), and when the
    earliest time hold ends by itself (0: none)."""
    m = metrics()
    held = Counter(kind.value for kind in result.held_by.values())
    for kind in HoldKind:
        m.jobs_held.labels(hold=kind.value).set(held[kind.value])
    m.hold_release.set(result.release_at.timestamp() if result.release_at is not None else 0)


def count_outcome(result: TickResult | None, *, failed: bool) -> None:
    """A tick's outcome (its status; FAILED when it raised; SKIPPED when the lease made it skip) and, for one
    that went through, the time it ended."""
    m = metrics()
    if failed:
        m.ticks.labels(outcome=TickStatus.FAILED.value).inc()
    elif result is None:
        m.ticks.labels(outcome=SKIPPED).inc()
    else:
        m.ticks.labels(outcome=result.status.value).inc()
        m.last_tick.set(time.time())


def count_open_alerts(kinds: Iterable[str]) -> None:
    """The open alerts by kind, every kind shown (0 when none is open), as the alert monitor holds them."""
    open_by_kind = Counter(kinds)
    for kind in AlertKind:
        metrics().alerts_open.labels(kind=kind.value).set(open_by_kind[kind.value])
