"""Sensing many sources in parallel: once per distinct source, each with a timeout.

A source that fails or hangs is recorded as an error for that source only; the
others go on. A hung source's thread cannot be killed in Python, so it is abandoned
(daemon thread) and its slot handed to the next source.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from heartbeat_runner.records import Outcome
from heartbeat_runner.sources.base import SenseContext, SenseResult, SensingTarget, Source
from heartbeat_runner.sources.registry import source_for as default_source_for


@dataclass(frozen=True)
class SensingOutcome:
    target: SensingTarget
    trigger_job_ids: str
    result: SenseResult | None
    error: str | None
    duration_s: float

    @property
    def outcome(self) -> Outcome:
        if self.error is not None:
            return Outcome.ERROR
        return Outcome.NEW_DATA if self.result and self.result.new_data else Outcome.NO_NEW_DATA


def sense_all(
    targets: list[tuple[SensingTarget, str]],
    ctx: SenseContext,
    *,
    max_workers: int,
    timeout_s: float,
    source_for: Callable[[str], Source] = default_source_for,
    on_done: Callable[[SensingOutcome], None] | None = None,
) -> list[SensingOutcome]:
    """Sense every target with at most ``max_workers`` at a time; never wait past a timeout."""
    results: dict[str, SensingOutcome] = {}
    started: dict[str, float] = {}
    queue = deque(t for t, _ in targets)
    jobs_of = {t.source_key: jobs for t, jobs in targets}
    by_key = {t.source_key: t for t, _ in targets}
    changed = threading.Condition()

    def finish(outcome: SensingOutcome) -> None:
        # under `changed`
        key = outcome.target.source_key
        if key in results:
            return  # already timed out
        results[key] = outcome
        started.pop(key, None)
        if on_done is not None:
            on_done(outcome)
        changed.notify_all()

    def work(target: SensingTarget) -> None:
        begin = time.monotonic()
        try:
            result, error = source_for(target.sensor_source).sense(target, ctx), None
        except Exception as exc:  # noqa: BLE001 - any failure is this source's error only
            result, error = None, _describe(exc)
        with changed:
            finish(SensingOutcome(target, jobs_of[target.source_key], result, error, time.monotonic() - begin))

    with changed:
        while queue or started:
            while queue and len(started) < max(1, max_workers):
                target = queue.popleft()
                started[target.source_key] = time.monotonic()
                threading.Thread(target=work, args=(target,), daemon=True,
                                 name=f"sense-{target.source_key[:40]}").start()
            now = time.monotonic()
            for key, begin in list(started.items()):
                if now - begin >= timeout_s:
                    finish(SensingOutcome(by_key[key], jobs_of[key], None,
                                          f"timed out after {timeout_s:g}s", now - begin))
            if started:
                next_deadline = min(started.values()) + timeout_s
                changed.wait(timeout=max(0.0, next_deadline - time.monotonic()) + 0.001)
    return [results[t.source_key] for t, _ in targets]


def _describe(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:2000]
