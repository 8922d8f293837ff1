"""Bounded, parallel jobs API calls: a pool of workers, a budget per tick and a rate limit per endpoint.

Invariants:

* at most ``JobsApiLimits.concurrency`` calls are in flight at once;
* no call *starts* once the tick's budget (seconds or calls) is spent; the items that did
  not start are returned, in their order, so the caller carries them to the next tick;
* a budget, once spent, stays spent, so the items left over are always a suffix of the input;
* a ``JobsBackendError`` answers its own item; any other exception (an injected fault, a bug)
  propagates to the caller after the calls in flight have finished.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from heartbeat_runner.core.errors import JobsBackendError
from heartbeat_runner.core.settings import JobsApiLimits

T = TypeVar("T")
R = TypeVar("R")


class ApiBudget:
    """What one tick may still spend on jobs API calls: a deadline and a number of calls (thread-safe)."""

    def __init__(self, limits: JobsApiLimits | None = None):
        self.limits = limits or JobsApiLimits()
        self.deadline = time.monotonic() + self.limits.budget_s
        self.max_calls = self.limits.max_calls
        self.calls = 0
        self._spent = False
        self._lock = threading.Lock()

    def take(self) -> bool:
        """Spend one call if the budget allows it now; False (and spent for good) once it does not."""
        with self._lock:
            if self._spent or self.calls >= self.max_calls or time.monotonic() >= self.deadline:
                self._spent = True
                return False
            self.calls += 1
            return True

    def time_only(self) -> ApiBudget:
        """A budget with the same deadline and no count of calls: for the pages of a listing, which have
        their own page budget, so that triggering cannot starve reconciliation."""
        view = ApiBudget(self.limits)
        view.deadline, view.max_calls = self.deadline, sys.maxsize
        return view

    @property
    def spent(self) -> bool:
        """Whether no call may start any more (the deadline passed or the calls ran out); stays so."""
        with self._lock:
            self._spent = self._spent or self.calls >= self.max_calls or time.monotonic() >= self.deadline
            return self._spent


class RateLimiter:
    """At most ``rate_per_s`` calls a second, spaced evenly; callers wait their turn (thread-safe)."""

    def __init__(self, rate_per_s: float):
        self.interval = 1.0 / rate_per_s
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = time.monotonic()
            turn = max(now, self._next)
            self._next = turn + self.interval
        if turn > now:
            time.sleep(turn - now)


@dataclass(frozen=True)
class Answer(Generic[T, R]):
    """What one call answered: a value, or the error the backend raised."""

    item: T
    value: R | None = None
    error: JobsBackendError | None = None


@dataclass
class Calls(Generic[T, R]):
    """The answers of the calls that ran (in input order) and the items that did not start (a suffix)."""

    answers: list[Answer[T, R]] = field(default_factory=list)
    not_started: list[T] = field(default_factory=list)


def call_all(items: Sequence[T], call: Callable[[T], R], budget: ApiBudget,
             on_answer: Callable[[int], None] | None = None) -> Calls[T, R]:
    """Call ``call(item)`` for each item on a pool of ``budget.limits.concurrency`` workers, within ``budget``.

    Items start in their order (a worker takes the next item and its budget under one lock), so what
    did not start is a suffix. ``on_answer(n)`` runs after the n-th answer (a crash point, in tests)."""
    results: list[Answer[T, R] | None] = [None] * len(items)
    cursor = _Cursor(len(items), budget)

    def worker() -> None:
        while (index := cursor.next()) is not None:
            try:
                results[index] = Answer(items[index], value=call(items[index]))
            except JobsBackendError as exc:
                results[index] = Answer(items[index], error=exc)
            except BaseException:
                cursor.halt()  # no new call starts; the calls in flight finish
                raise
            if on_answer is not None:
                on_answer(cursor.answered())

    workers = min(budget.limits.concurrency, len(items))
    if workers:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jobs-api") as pool:
            # each worker in a copy of the caller's context: its log lines keep the tick's run id and stage
            for future in [pool.submit(contextvars.copy_context().run, worker) for _ in range(workers)]:
                future.result()
    calls: Calls[T, R] = Calls()
    for item, answer in zip(items, results):
        if answer is None:
            calls.not_started.append(item)
        else:
            calls.answers.append(answer)
    return calls


class _Cursor:
    """Hands out item indexes in order while the budget lasts; counts answers."""

    def __init__(self, size: int, budget: ApiBudget):
        self.size, self.budget = size, budget
        self.position = 0
        self.answers = 0
        self._lock = threading.Lock()

    def next(self) -> int | None:
        with self._lock:
            if self.position >= self.size or not self.budget.take():
                return None
            self.position += 1
            return self.position - 1

    def halt(self) -> None:
        with self._lock:
            self.size = self.position

    def answered(self) -> int:
        with self._lock:
            self.answers += 1
            return self.answers
