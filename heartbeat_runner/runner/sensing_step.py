"""Steps 1 and 2 of a tick: sense the due sources, and the NEW_DATA / CURSOR events of what was sensed.

Invariant: an event is made against the cursors as they are when it is recorded (read again after sensing),
with a deterministic id for new data (the source, the cursor event it was sensed from and the window), so a
source another process moved on meanwhile is not recorded twice, and re-sensing the same window after a crash
gives the same event.
"""

from __future__ import annotations

import logging

from heartbeat_runner.core.records import Event, EventType, Outcome, new_data_event_id, random_event_id
from heartbeat_runner.runner.tick_parts import TickParts
from heartbeat_runner.runner.tick_result import TickResult
from heartbeat_runner.sensing.parallel import SensingOutcome, sense_all

log = logging.getLogger(__name__)


class Sensing:
    """Steps 1 and 2 of every tick of one runner (module docstring: its invariant)."""

    def __init__(self, parts: TickParts):
        self.parts = parts
        #: source keys whose latest recorded sensing failed (None: not read yet by this process)
        self._failing: set[str] | None = None
        #: source keys the latest tick left skipped (not due, not sensed): a woken tick senses those due now
        self.skipped_last: set[str] = set()

    def sense(self, result: TickResult) -> None:
        """Sense every due source in the tick's scope; note the skipped ones and the sources that recovered.

        A woken tick also senses the sources the latest tick left skipped that are due now: a run's end that
        another process recorded (a job's own ``complete``, folded by the refresh before sensing), a resume or a
        reset made them eligible, and data may have landed while they were skipped (the ends this tick records
        itself are ``Heartbeat._after_ends``'s)."""
        due = self.parts.store.sensors_due()
        if result.scope.source_keys is not None:
            named = result.scope.source_keys | self.skipped_last
            due = [d for d in due if d[0].source_key in named]
        result.skipped = self.parts.store.sensors_skipped()
        self.skipped_last = {s.source_key for s in result.skipped}
        self.parts.progress(f"sensing {len(due)} source(s)")
        # a wake-up's sources are likely changed: a bulk look would only delay sensing them
        result.sensed = sense_all(due, self.parts.ctx, max_workers=self.parts.settings.max_workers,
                                  timeout_s=self.parts.settings.sensor_timeout_s, look_first=result.scope.polls)
        result.recovered = self.recoveries(result.sensed)

    def sensed_events(self, result: TickResult) -> list[Event]:
        """The NEW_DATA / CURSOR events of what ``result`` sensed, against the cursors as they are now."""
        events = []
        new_data = any(s.result is not None and s.result.new_data for s in result.sensed)
        # Read again now: a source whose cursor moved while it was sensed was recorded by someone else.
        current = self.parts.store.current_cursors() if new_data else None
        for sensed in result.sensed:
            outcome, target = sensed.result, sensed.target
            if outcome is None or (not outcome.new_data and outcome.cursor_to in (None, target.cursor)):
                continue
            key = target.source_key
            if current is not None and (key not in current or current[key][0] != target.cursor):
                log.warning("%s moved on while it was sensed (another runner?); not recorded", key, extra={"source": key})
                continue
            parent = current[key][1] if current is not None else None
            cursor_to = outcome.cursor_to if outcome.cursor_to is not None else target.cursor
            kind = EventType.NEW_DATA if outcome.new_data else EventType.CURSOR
            event_id = (new_data_event_id(key, parent, target.cursor, cursor_to) if kind is EventType.NEW_DATA
                        else random_event_id())
            events.append(Event(
                event_type=kind, run_id=result.run_id, snapshot_ts=result.snapshot_ts, event_id=event_id,
                source_key=target.source_key, sensor_source=target.sensor_source, sensor_id=target.sensor_id,
                cursor_from=target.cursor, cursor_to=cursor_to,
                window_from=outcome.window_from, window_to=outcome.window_to, rows=outcome.rows,
                message=outcome.detail,
                payload=outcome.payload(),
            ))
        return events

    def recoveries(self, sensed: list[SensingOutcome]) -> list[str]:
        """Sources whose latest recorded sensing failed and that sensed now. Such a tick is recorded, not
        coalesced as idle, so the failure shown by `status`, `explain` and the page clears at once rather
        than when an idle streak is flushed. The failing set is read once per process, then kept up to date
        from each tick's outcomes (a source not sensed this tick keeps its state)."""
        if self._failing is None:
            self._failing = {r["source_key"] for r in self.parts.store.sensing_failures()}
        keys = {s.target.source_key for s in sensed}
        failing_now = {s.target.source_key for s in sensed if s.outcome is Outcome.ERROR}
        recovered = sorted((keys - failing_now) & self._failing)
        self._failing = (self._failing - keys) | failing_now
        return recovered
