"""Sensing many sources in parallel: once per distinct source, each with a timeout.

A source that fails or hangs is recorded as an error for that source only; the
others go on. A hung source's thread cannot be killed in Python, so it is abandoned
(daemon thread) and its slot handed to the next source.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from heartbeat_runner.core.errors import describe
from heartbeat_runner.core.records import Outcome
from heartbeat_runner.sensing.sources.base import SenseContext, SenseResult, SensingTarget, Source
from heartbeat_runner.sensing.sources.registry import source_for as default_source_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SensingOutcome:
    target: SensingTarget
    trigger_job_ids: str
    result: SenseResult | None
    error: str | None
    duration_s: float

    @property
    def note(self) -> str | None:
        """What the run report shows beside the outcome: the error, or a warning from a source that worked."""
        return self.error if self.error is not None else (self.result.warning if self.result else None)

    def as_dict(self) -> dict[str, str | None]:
        return {"source_key": self.target.source_key, "outcome": self.outcome.value, "error": self.error,
                "window_from": self.result.window_from if self.result else None,
                "window_to": self.result.window_to if self.result else None}

    @property
    def outcome(self) -> Outcome:
        if self.error is not None:
            return Outcome.ERROR
        return Outcome.NEW_DATA if self.result and self.result.new_data else Outcome.NO_NEW_DATA


def _unchanged(targets: list[SensingTarget], ctx: SenseContext,
               source_for: Callable[[str], Source]) -> dict[str, str]:
    """The targets their source classes rule out in bulk (``Source.unchanged``), by source key. A bulk look
    that fails rules nothing out: every target is then sensed one by one, as without it."""
    by_class: dict[type, tuple[Source, list[SensingTarget]]] = {}
    for target in targets:
        try:
            source = source_for(target.sensor_source)
        except Exception:  # noqa: BLE001 - an unknown type fails when it is sensed, with its own error
            continue
        by_class.setdefault(type(source), (source, []))[1].append(target)
    out: dict[str, str] = {}
    for source, group in by_class.values():
        try:
            out.update(source.unchanged(group, ctx))
        except Exception as exc:  # noqa: BLE001 - see above
            log.warning("%s: the bulk look for unchanged sources failed, sensing each (%s)",
                        type(source).__name__, describe(exc))
    return out


def sense_all(
    targets: list[tuple[SensingTarget, str]],
    ctx: SenseContext,
    *,
    max_workers: int,
    timeout_s: float,
    source_for: Callable[[str], Source] = default_source_for,
    on_done: Callable[[SensingOutcome], None] | None = None,
) -> list[SensingOutcome]:
    """Sense every target with at most ``max_workers`` at a time; never wait past a timeout.

    A few long-lived workers take targets from a queue: a thread per target costs more
    than sensing a local source does (about a second per thousand targets).
    """
    results: dict[str, SensingOutcome] = {}
    started: dict[str, float] = {}  # source key -> when a worker began sensing it
    jobs_of = {t.source_key: jobs for t, jobs in targets}
    by_key = {t.source_key: t for t, _ in targets}
    ruled_out = _unchanged(list(by_key.values()), ctx, source_for)
    for key, detail in ruled_out.items():
        outcome = SensingOutcome(by_key[key], jobs_of[key], SenseResult(new_data=False, detail=detail), None, 0.0)
        results[key] = outcome
        if on_done is not None:
            on_done(outcome)
    queue = deque(t for key, t in by_key.items() if key not in ruled_out)
    if not queue:
        return [results[t.source_key] for t, _ in targets]
    changed = threading.Condition()

    def finish(outcome: SensingOutcome) -> bool:
        """Record an outcome (under ``changed``); False when the target had already timed out."""
        key = outcome.target.source_key
        if key in results:
            return False
        results[key] = outcome
        started.pop(key, None)
        if on_done is not None:
            on_done(outcome)
        if len(results) == len(by_key):
            changed.notify_all()
        return True

    def worker() -> None:
        while True:
            with changed:
                if not queue:
                    return
                target = queue.popleft()
                started[target.source_key] = begin = time.monotonic()
            try:
                result, error = source_for(target.sensor_source).sense(target, ctx), None
            except Exception as exc:  # noqa: BLE001 - any failure is this source's error only
                result, error = None, describe(exc)
                log.info("sensing %s failed: %s", target.source_key, error, extra={"source": target.source_key})
            with changed:
                if not finish(SensingOutcome(target, jobs_of[target.source_key], result, error,
                                             time.monotonic() - begin)):
                    return  # it timed out and a new worker took this one's place

    def start_worker() -> None:
        # the tick's run id and stage go along into the worker's log lines (core/logs.py)
        threading.Thread(target=contextvars.copy_context().run, args=(worker,), daemon=True,
                         name="sense-worker").start()

    with changed:
        for _ in range(min(max(1, max_workers), len(queue))):
            start_worker()
        while len(results) < len(by_key):
            # Targets started later have later deadlines, so the earliest one now is the next to check.
            deadline = min(started.values(), default=time.monotonic()) + timeout_s
            changed.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.001)
            now = time.monotonic()
            for key, begin in list(started.items()):
                if now - begin >= timeout_s:
                    finish(SensingOutcome(by_key[key], jobs_of[key], None,
                                          f"timed out after {timeout_s:g}s", now - begin))
                    if queue:
                        start_worker()  # the hung worker is abandoned; its slot goes to a new one
    return [results[t.source_key] for t, _ in targets]

