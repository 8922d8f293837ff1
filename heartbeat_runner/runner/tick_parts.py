"""What every step of a tick works with: the store, the control table, the jobs backend, the sensing context, the
run policies, and the one way a step commits events (:meth:`TickParts.append`).

Built once per runner (``Heartbeat``) and shared by its steps (runner/sensing_step.py, triggering.py,
reconciliation.py, tick_report.py). It holds no state of one tick: what a tick found is in its ``TickResult``,
and its jobs API budget is made per tick and handed to the steps that call the API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from heartbeat_runner.core.records import Event, EventType
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.jobs.base import JobsBackend
from heartbeat_runner.lakehouse.control_table import ControlTable
from heartbeat_runner.lakehouse.store import TableStore
from heartbeat_runner.policies.retry import RetryPolicies
from heartbeat_runner.policies.trigger_shaping import TriggerShaping
from heartbeat_runner.runner.empty_reads import SKIPS, EmptyReads
from heartbeat_runner.runner.sequences import Sequences
from heartbeat_runner.runner.tick_result import RUN_EVENT_TYPES, TickResult
from heartbeat_runner.sensing.sources.base import SenseContext


def _nothing() -> None:
    """The default hook: nothing to check."""


@dataclass
class TickParts:
    """The collaborators of a tick's steps.

    Invariant: every event a step records goes through :meth:`append`, one commit per call, so the control
    table keeps the one record of the runner's own commits (what the folds and the empty reads ask)."""

    store: TableStore
    control: ControlTable
    backend: JobsBackend
    ctx: SenseContext
    #: catch-up sequences and event-time windows
    sequences: Sequences
    policies: RetryPolicies = field(default_factory=RetryPolicies)
    #: the trigger holds and pools of the run-policy file (off unless it has a trigger section)
    shaping: TriggerShaping = field(default_factory=TriggerShaping)
    progress: Callable[[str], None] = lambda message: None
    #: called before any jobs API call; raising stops the tick there (a loop checks it still holds the lease)
    before_trigger: Callable[[], None] = _nothing
    #: reads found empty that only other processes' commits can fill (the asks, sequences moved on, skips), kept
    #: against the control table's record of the runner's own commits
    empty: EmptyReads = field(init=False)

    #: the runner's settings (the store's, unless a caller gives the tick others)
    settings: Settings = field(init=False)

    def __post_init__(self) -> None:
        self.settings = self.store.engine.settings
        self.empty = EmptyReads(self.control.own)

    def append(self, result: TickResult, events: list[Event]) -> None:
        """One commit of ``events`` through the control table (which records it as the runner's own), counted in
        ``result``."""
        self.control.append(events)
        result.events_written += len(events)
        result.run_events += [e for e in events if e.event_type in RUN_EVENT_TYPES]
        if any(e.event_type is EventType.RUN_SKIPPED for e in events):
            self.empty.found(SKIPS, empty=False)
