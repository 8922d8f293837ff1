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
from dataclasses import dataclass, field

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


def _unchanged(targets: list[SensingTarget], ctx: SenseContext, source_for: Callable[[str], Source],
               timeout_s: float) -> dict[str, str]:
    """The targets their source classes rule out in bulk (``Source.unchanged``), by source key. The looks of
    the classes run at once, each on a thread of its own. A bulk look that fails, or is not done ``timeout_s``
    after they started (a hung network file system, a broker that does not answer), rules nothing out: its
    targets are then sensed one by one, each with its own timeout, as without it."""
    by_class: dict[type, tuple[Source, list[SensingTarget]]] = {}
    for target in targets:
        try:
            source = source_for(target.sensor_source)
        except Exception:  # noqa: BLE001 - an unknown type fails when it is sensed, with its own error
            continue
        by_class.setdefault(type(source), (source, []))[1].append(target)
    looks = [_BulkLook(source, group, ctx) for source, group in by_class.values()]
    deadline = time.monotonic() + timeout_s
    out: dict[str, str] = {}
    for look in looks:
        out.update(look.answer(deadline, timeout_s))
    return out


class _BulkLook:
    """``source.unchanged(group)`` on a thread of its own, started at once; its answer is {} when it fails or
    is still running at the deadline (the thread is then abandoned, as a hung sensing worker is)."""

    def __init__(self, source: Source, group: list[SensingTarget], ctx: SenseContext):
        self.source, self.group, self.ctx = source, group, ctx
        self.found: list[dict[str, str]] = []
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._look,), daemon=True,
                                       name="sense-bulk")
        self.thread.start()

    def _look(self) -> None:
        try:
            self.found.append(self.source.unchanged(self.group, self.ctx))
        except Exception as exc:  # noqa: BLE001 - see _unchanged
            log.warning("%s: the bulk look for unchanged sources failed, sensing each (%s)",
                        type(self.source).__name__, describe(exc))

    def answer(self, deadline: float, timeout_s: float) -> dict[str, str]:
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive():
            log.warning("%s: the bulk look for unchanged sources took more than %gs, sensing each",
                        type(self.source).__name__, timeout_s)
            return {}
        return self.found[0] if self.found else {}


#: a worker takes up to this many targets at a time (fewer when that would leave workers idle): thousands of
#: local sources cost more in handing each one to a thread than in sensing it (~30 µs for a file look)
MAX_CHUNK = 64


@dataclass
class _Worker:
    """One sensing thread's share: the targets it took (``chunk``, consumed from the left), the one it is
    sensing now and since when, and the outcomes of its chunk not recorded yet (``done``: recorded together,
    one lock round per chunk). The pool's thread reads ``current`` without the lock (one tuple, replaced
    whole) to find a target past its timeout; it then records ``done``, takes back the rest of the chunk and
    abandons the worker (``abandoned``), whose hung call may never return."""

    chunk: deque[SensingTarget]
    current: tuple[str, float] | None = None
    abandoned: bool = False
    done: list[SensingOutcome] = field(default_factory=list)


def sense_all(
    targets: list[tuple[SensingTarget, str]],
    ctx: SenseContext,
    *,
    max_workers: int,
    timeout_s: float,
    source_for: Callable[[str], Source] = default_source_for,
    on_done: Callable[[SensingOutcome], None] | None = None,
    look_first: bool = True,
) -> list[SensingOutcome]:
    """Sense every target with at most ``max_workers`` at a time; never wait past a timeout.

    With ``look_first``, the bulk looks of the source classes (``Source.unchanged``) rule out what they can
    before; without it (targets a wake-up named: likely changed), every target is sensed.

    A few long-lived workers take targets from a queue, in chunks (:data:`MAX_CHUNK`) when there are many:
    a thread per target costs more than sensing a local source does (about a second per thousand targets),
    and so does a lock round per target at ten thousand. A worker whose queue is empty takes from the far
    end of another's chunk. Each target still has its own timeout, counted from when its worker began it:
    a target past it is recorded as timed out, the rest of its worker's chunk goes back to the queue, and
    a new worker takes the abandoned one's slot.
    """
    results: dict[str, SensingOutcome] = {}
    jobs_of = {t.source_key: jobs for t, jobs in targets}
    by_key = {t.source_key: t for t, _ in targets}
    ruled_out = _unchanged(list(by_key.values()), ctx, source_for, timeout_s) if look_first else {}
    for key, detail in ruled_out.items():
        outcome = SensingOutcome(by_key[key], jobs_of[key], SenseResult(new_data=False, detail=detail), None, 0.0)
        results[key] = outcome
        if on_done is not None:
            on_done(outcome)
    queue = deque(t for key, t in by_key.items() if key not in ruled_out)
    if not queue:
        return [results[t.source_key] for t, _ in targets]
    workers_n = min(max(1, max_workers), len(queue))
    chunk_size = max(1, min(MAX_CHUNK, len(queue) // (4 * workers_n)))
    changed = threading.Condition()
    workers: list[_Worker] = []

    def finish(outcome: SensingOutcome) -> None:
        """Record an outcome (under ``changed``) unless the target already has one (it timed out)."""
        key = outcome.target.source_key
        if key in results:
            return
        results[key] = outcome
        if on_done is not None:
            on_done(outcome)
        if len(results) == len(by_key):
            changed.notify_all()

    def sense_one(target: SensingTarget, begin: float) -> SensingOutcome:
        try:
            result, error = source_for(target.sensor_source).sense(target, ctx), None
        except Exception as exc:  # noqa: BLE001 - any failure is this source's error only
            result, error = None, describe(exc)
            log.info("sensing %s failed: %s", target.source_key, error, extra={"source": target.source_key})
        return SensingOutcome(target, jobs_of[target.source_key], result, error, time.monotonic() - begin)

    def record(me: _Worker) -> None:
        """Record what ``me`` has sensed so far (under ``changed``)."""
        done, me.done = me.done, []
        for outcome in done:
            finish(outcome)

    def take(me: _Worker) -> bool:
        """Fill ``me``'s chunk from the queue or, once it is empty, from the far end of another worker's
        chunk (so a target that hangs holds up only itself, and no worker idles while others have work).
        False when there is nothing left to take (under ``changed``)."""
        for _ in range(min(chunk_size, len(queue))):
            me.chunk.append(queue.popleft())
        for other in workers:
            if me.chunk:
                break
            for _ in range(len(other.chunk) // 2 or 1):
                try:
                    me.chunk.append(other.chunk.pop())  # its owner takes from the left: each target goes once
                except IndexError:
                    break
        return bool(me.chunk)

    def work(me: _Worker) -> None:
        while True:
            with changed:
                if me.abandoned or not take(me):
                    return
            while not me.abandoned:
                try:
                    target = me.chunk.popleft()  # the pool's thread may take the rest back meanwhile
                except IndexError:
                    break
                begin = time.monotonic()
                me.current = (target.source_key, begin)
                me.done.append(sense_one(target, begin))
                me.current = None
            with changed:
                record(me)

    def start_worker() -> None:
        me = _Worker(deque())
        workers.append(me)
        # the tick's run id and stage go along into the worker's log lines (core/logs.py)
        threading.Thread(target=contextvars.copy_context().run, args=(work, me), daemon=True,
                         name="sense-worker").start()

    def time_out(me: _Worker, key: str, began: float, now: float) -> None:
        """``me`` has sensed ``key`` for longer than the timeout: record that and what ``me`` sensed before it,
        hand the rest of its chunk back to the queue, and start a worker in its place (under ``changed``)."""
        me.abandoned = True
        finish(SensingOutcome(by_key[key], jobs_of[key], None, f"timed out after {timeout_s:g}s", now - began))
        record(me)
        while True:
            try:
                queue.appendleft(me.chunk.pop())
            except IndexError:
                break
        if queue:
            start_worker()

    with changed:
        for _ in range(workers_n):
            start_worker()
        while len(results) < len(by_key):
            # every target being sensed, abandoned workers' too (one may have taken a last target as it was
            # abandoned); the earliest begun is the next to time out
            sensing = [(me, current) for me in workers if (current := me.current) is not None
                       and current[0] not in results]
            deadline = min((began for _, (_, began) in sensing), default=time.monotonic()) + timeout_s
            changed.wait(timeout=min(max(0.0, deadline - time.monotonic()) + 0.001, timeout_s))
            now = time.monotonic()
            for me, (key, began) in sensing:
                if now - began >= timeout_s and me.current == (key, began) and key not in results:
                    time_out(me, key, began, now)
    return [results[t.source_key] for t, _ in targets]
