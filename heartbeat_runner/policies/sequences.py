"""Sequences of runs: how the tick turns a job's backlog into runs of at most ``max_window``.

The tick asks three things of a ``Sequences``:

- ``first_request``: the parameters of the trigger request of a ready job. With a
  catch-up policy and a backlog larger than its ``max_window``, the request covers the
  first window only and records the whole plan (``policies.catch_up.SequencePlan``) in its
  payload. The request consumes the whole backlog, as any trigger does.
- ``after_success``: when run k of a sequence succeeded, the NEXT_WINDOW_REQUESTED event
  of run k+1 and its request. The tick appends that event *in the same commit* as the
  COMPLETED event, so no tick ever sees the job COMPLETED with runs left, and then calls
  the jobs API (a crash in between is resumed as any request without a run id).
- ``due``: the next runs of sequences whose last run succeeded some other way (``complete``,
  a manual run found after a failure): the view ``heartbeat_job_sequences`` lists them.

Tokens are deterministic (``next_window_token``), so a window is triggered exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from heartbeat_runner.core.records import Event, EventType, job_parameters, sequence_event_id
from heartbeat_runner.core.windows import CUT_POINTS_KEY, EventTimes, SourceWindow, WindowBounds, epoch_seconds, iso
from heartbeat_runner.jobs.base import TriggerRequest
from heartbeat_runner.lakehouse.store import ReadyRow, TableStore
from heartbeat_runner.policies.catch_up import (
    RUN_KEY,
    RUNS_KEY,
    CatchUpPolicy,
    SequencePlan,
    next_window_token,
    plan_sequence,
    policy_for,
    window_parameters,
)
from heartbeat_runner.policies.event_windows import (
    Arrival,
    LateData,
    LateRows,
    Window,
    WindowLedger,
    WindowPolicy,
    final_windows,
    late_rows,
    ledger_from_history,
    window_token,
)
from heartbeat_runner.sensing.sources.registry import source_for

#: The payload key naming the token of the request that started a sequence.
SEQUENCE_KEY = "_sequence"
#: The payload key of a window plan (trigger request, WINDOW_SKIPPED): the end of its last window.
UNTIL_KEY = "_windows_until_s"
#: The payload key of the ledger each plan and correction of a windowed job carries (event_windows.WindowLedger).
LEDGER_KEY = "_window_ledger"


@dataclass(frozen=True)
class WindowPlan:
    """What one windowed job's final windows become: skip events, and the request of the first window with
    data (a sequence over every window with data), with the payload recorded with it."""

    job_id: str
    skipped: list[Event]
    request: TriggerRequest | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class NextRun:
    """The next run of a sequence: its event (to append) and its request (to send after)."""

    event: Event
    request: TriggerRequest


class Sequences:
    """Plans and continues sequences of runs: bounded catch-up (``policies``) and event-time windows
    (``windows``), for the tick."""

    def __init__(self, store: TableStore, policies: Mapping[str, CatchUpPolicy],
                 windows: Mapping[str, WindowPolicy] | None = None):
        self.store = store
        self.policies = policies
        self.windows = dict(windows or {})

    # -- the first run ------------------------------------------------------------------------

    def first_request(self, job_id: str, rows: Sequence[ReadyRow], token: str, base: dict[str, str],
                      events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The payload of the trigger request consuming ``rows``: ``base`` with all their windows, or,
        under a catch-up policy with a larger backlog, run 1 of a sequence. ``events``: NEW_DATA events
        (``store.new_data_events``) that include the ones ``rows`` consume, read once for every ready job.
        SourceError when a source cannot cut its backlog as the policy asks (the job is then not triggered)."""
        backlogs = _backlogs(rows, events)
        policy = policy_for(self.policies, job_id)
        if policy is not None:
            plan = self.plan(rows, policy, backlogs)
            if len(plan.runs) > 1:
                return {**plan.parameters(1, base, self.bounds), SEQUENCE_KEY: token}
        windows = [backlogs[r.source_key].window if r.source_key in backlogs else
                   SourceWindow(r.sensor_source, r.sensor_id, None, None, r.pending_window_from, r.pending_window_to)
                   for r in rows]
        counts = {f"{b.window.sensor_source}:{b.window.sensor_id}": b.rows for b in backlogs.values()}
        return window_parameters(base, windows, self.bounds, {}, counts)

    def plan(self, rows: Sequence[ReadyRow], policy: CatchUpPolicy, backlogs: Mapping[str, Backlog]) -> SequencePlan:
        """Each source's backlog (its earliest pending cursor to its latest) cut by its source type."""
        pieces = {row.source_key: source_for(row.sensor_source).split(backlogs[row.source_key].window,
                                                                     policy.max_window, row.upstream_key)
                  for row in rows if row.source_key in backlogs}
        return plan_sequence(pieces)

    @staticmethod
    def bounds(window: SourceWindow) -> WindowBounds:
        """``window`` in the job's terms, as its source type gives them."""
        return source_for(window.sensor_source).bounds(window.cursor_from, window.cursor_to)

    # -- the next runs ------------------------------------------------------------------------

    def after_success(self, job_id: str, job_name: str | None, token: str | None, tick_run_id: str,
                      snapshot_ts: datetime) -> NextRun | None:
        """Run k+1 when the request ``token`` (run k of a sequence) has just succeeded; else None."""
        if token is None:
            return None
        payload = self.store.request_payload(token)
        return self._next(job_id, job_name, payload, tick_run_id, snapshot_ts)

    def due(self, tick_run_id: str, snapshot_ts: datetime) -> list[NextRun]:
        """The next runs of sequences whose latest run succeeded without the runner seeing it."""
        found = []
        for row in self.store.next_windows_due():
            payload = self.store.request_payload(row["idempotency_token"])
            step = self._next(row["trigger_job_id"], None, payload, tick_run_id, snapshot_ts)
            if step is not None:
                found.append(step)
        return found

    def _next(self, job_id: str, job_name: str | None, payload: Mapping[str, Any], tick_run_id: str,
              snapshot_ts: datetime) -> NextRun | None:
        plan = SequencePlan.load(payload)
        if plan is None or int(payload[RUN_KEY]) >= int(payload[RUNS_KEY]):
            return None
        run, first = int(payload[RUN_KEY]) + 1, str(payload[SEQUENCE_KEY])
        token = next_window_token(first, run)
        parameters = {**plan.parameters(run, {"heartbeat_run_id": tick_run_id}, self.bounds), SEQUENCE_KEY: first}
        event = Event(event_type=EventType.NEXT_WINDOW_REQUESTED, run_id=tick_run_id, snapshot_ts=snapshot_ts,
                      event_id=sequence_event_id(token),
                      trigger_job_id=job_id, idempotency_token=token,
                      message=f"catch-up run {run} of {len(plan.runs)}",
                      payload=json.dumps(parameters, sort_keys=True))
        return NextRun(event, TriggerRequest(job_id, job_name, token, job_parameters(parameters)))

    # -- event-time windows -------------------------------------------------------------------

    def window_plans(self, tick_run_id: str, snapshot_ts: datetime) -> list[WindowPlan]:
        """For each windowed job whose next window is final (heartbeat_job_windows): its final windows,
        the empty ones skipped (recorded), the others one run each, oldest first."""
        plans = []
        for due in self.store.windows_due():
            windows = final_windows(int(due["next_window_start_s"]), int(due["watermark_s"]), int(due["size_s"]))
            if windows:
                plans.append(self._plan_windows(due["trigger_job_id"], windows, tick_run_id, snapshot_ts))
        return plans

    def _plan_windows(self, job_id: str, windows: list[Window], tick_run_id: str, snapshot_ts: datetime) -> WindowPlan:
        sources = self._sources(job_id)
        before = self._ledger(job_id, sources)
        ledger = before.planned(windows[-1].end_s).payload()
        with_data = [w for w in windows if before.rows_in(w) > 0]
        skipped = [self._skip_event(job_id, w, tick_run_id, snapshot_ts, ledger) for w in windows if w not in with_data]
        if not with_data:
            return WindowPlan(job_id, skipped, None, {})
        plan = SequencePlan(
            [[SourceWindow(src, sid, None, None, iso(w.start_s), iso(w.end_s)) for src, sid in sources.values()]
             for w in with_data],
            [{"window_start": iso(w.start_s), "window_end": iso(w.end_s), "heartbeat_window_correction": "false"}
             for w in with_data])
        token = window_token(job_id, with_data[0])
        payload = {**plan.parameters(1, {"heartbeat_run_id": tick_run_id}, self.bounds), SEQUENCE_KEY: token,
                   UNTIL_KEY: windows[-1].end_s, LEDGER_KEY: ledger}
        return WindowPlan(job_id, skipped, TriggerRequest(job_id, None, token, job_parameters(payload)), payload)

    def correction(self, job_id: str, tick_run_id: str) -> WindowPlan | None:
        """Under ``late_data: rerun``: the one correction run of the oldest window that got late rows and
        has not been corrected yet; None when there is none. Reads the arrivals since the job's latest
        plan (the hot log), whatever the job's age."""
        policy = self.windows.get(job_id)
        if policy is None or policy.late_data is not LateData.RERUN:
            return None
        sources = self._sources(job_id)
        ledger = self._ledger(job_id, sources)
        for start in ledger.pending:
            ledger = ledger.corrected(start)
            window = Window(start, start + policy.size_s)
            token = window_token(job_id, window, correction=True)
            if self.store.request_payload(token):
                continue  # corrected once already: later late rows earn no second run
            windows = [SourceWindow(src, sid, None, None, iso(window.start_s), iso(window.end_s))
                       for src, sid in sources.values()]
            own = {"window_start": iso(window.start_s), "window_end": iso(window.end_s),
                   "heartbeat_window_correction": "true"}
            payload = {**window_parameters({"heartbeat_run_id": tick_run_id}, windows, self.bounds, own),
                       LEDGER_KEY: ledger.payload()}
            return WindowPlan(job_id, [], TriggerRequest(job_id, None, token, job_parameters(payload)), payload)
        return None

    def late_data(self, job_id: str) -> list[LateRows]:
        """Rows that arrived for windows of ``job_id`` already planned (finalized) when they arrived, over
        the job's whole history (for ``explain`` and the status page, not the tick)."""
        policy = self.windows.get(job_id)
        if policy is None:
            return []
        arrivals = self._arrivals(self.store.event_time_events(sorted(self._sources(job_id))))
        return late_rows(((a.event_ts, a.source_key, a.times) for a in arrivals),
                         _planned_until(valid_plans(self.store.window_plans(job_id))), policy.size_s)

    def _ledger(self, job_id: str, sources: Mapping[str, tuple[str, str]]) -> WindowLedger:
        """The job's window ledger now: the one its latest plan carries, advanced over the arrivals since
        (the hot log holds them); replayed from the whole history (archive included) when no plan carries
        one for these sources (the first plan, plans of an older version, a RESET since, a source added)."""
        policy = self.windows[job_id]
        keys, track_late = sorted(sources), policy.late_data is LateData.RERUN
        carried = latest_ledger(self.store.window_plans(job_id, archive=False))
        if carried is not None and carried.sources == tuple(keys):
            since = [a for a in self._arrivals(self.store.event_time_events(keys, archive=False))
                     if carried.through is None or a.event_ts > carried.through]
            return carried.advance(since, policy.size_s, track_late)
        plans = valid_plans(self.store.window_plans(job_id))
        corrected = {seconds for p in plans if (payload := _payload(p)).get("heartbeat_window_correction") == "true"
                     and (seconds := epoch_seconds(payload.get("window_start"))) is not None}
        return ledger_from_history(keys, self._arrivals(self.store.event_time_events(keys)), _planned_until(plans),
                                   corrected, policy.size_s, track_late)

    def _sources(self, job_id: str) -> dict[str, tuple[str, str]]:
        """source_key -> (sensor_source, sensor_id) of the job's active rows."""
        return {r["source_key"]: (r["sensor_source"], r["sensor_id"]) for r in self.store.control_rows(job_id)}

    @staticmethod
    def _arrivals(events: list[dict]) -> list[Arrival]:
        return [Arrival(e["event_ts"], e["source_key"], times) for e in events
                if (times := EventTimes.from_payload(_payload(e))) is not None]

    @staticmethod
    def _skip_event(job_id: str, window: Window, tick_run_id: str, snapshot_ts: datetime,
                    ledger: dict[str, Any]) -> Event:
        return Event(event_type=EventType.WINDOW_SKIPPED, run_id=tick_run_id, snapshot_ts=snapshot_ts,
                     event_id=sequence_event_id(window_token(job_id, window)), trigger_job_id=job_id,
                     message=f"window [{iso(window.start_s)}, {iso(window.end_s)}) had no data in any source",
                     payload=json.dumps({UNTIL_KEY: window.end_s, "window_start": iso(window.start_s),
                                         "window_end": iso(window.end_s), LEDGER_KEY: ledger}, sort_keys=True))


@dataclass(frozen=True)
class Backlog:
    """What a job consumes of one source: its earliest pending cursor to its latest (with the points it may be
    cut at), and the new rows sensing counted (None when no event counted any)."""

    window: SourceWindow
    rows: int | None


def _backlogs(rows: Sequence[ReadyRow], events: Sequence[Mapping[str, Any]]) -> dict[str, Backlog]:
    """Per source_key of ``rows``, the backlog the NEW_DATA ``events`` they consume make."""
    consumed = {i for r in rows for i in r.consumed_event_ids.split(",") if i}
    found: dict[str, Backlog] = {}
    for row in rows:
        mine = sorted((e for e in events if e["source_key"] == row.source_key and e["event_id"] in consumed),
                      key=lambda e: e["event_ts"])
        if not mine:
            continue
        counted = [e["rows"] for e in mine if e.get("rows") is not None]
        window = SourceWindow(row.sensor_source, row.sensor_id, mine[0]["cursor_from"], mine[-1]["cursor_to"],
                              row.pending_window_from, row.pending_window_to, _cut_points(mine))
        found[row.source_key] = Backlog(window, sum(counted) if counted else None)
    return found


def _payload(event: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(event["payload"]) if event.get("payload") else {}


def valid_plans(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The plans among a windowed job's ``events`` (oldest first): its trigger requests and WINDOW_SKIPPED,
    less the requests a later TRIGGER_ERROR of their token voided (as the SQL's lifecycle does)."""
    errors: dict[str, Any] = {}
    for event in events:
        if event["event_type"] == EventType.TRIGGER_ERROR.value and event["idempotency_token"]:
            errors[event["idempotency_token"]] = event["event_ts"]
    return [e for e in events if e["event_type"] in (EventType.TRIGGER_REQUESTED.value, EventType.WINDOW_SKIPPED.value)
            and not (e["idempotency_token"] in errors and errors[e["idempotency_token"]] >= e["event_ts"])]


def latest_ledger(events: Sequence[Mapping[str, Any]]) -> WindowLedger | None:
    """The ledger the latest valid plan among ``events`` (oldest first) carries; None when it carries
    none or the job was RESET after it."""
    plans = valid_plans(events)
    resets = [e["event_ts"] for e in events if e["event_type"] == EventType.RESET.value]
    if not plans or (resets and max(resets) >= plans[-1]["event_ts"]):
        return None
    found = _payload(plans[-1]).get(LEDGER_KEY)
    return WindowLedger.from_payload(found) if found else None


def _planned_until(plans: Sequence[Mapping[str, Any]]) -> list[tuple[datetime, int]]:
    """(when, windows planned until) of each plan that planned windows."""
    return [(p["event_ts"], int(payload[UNTIL_KEY])) for p in plans if UNTIL_KEY in (payload := _payload(p))]


def _cut_points(events: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Where a backlog of NEW_DATA ``events`` (oldest first) may be cut: the points sensing recorded in
    each event's payload, else the event's end."""
    points: list[str] = []
    for event in events:
        recorded = _payload(event).get(CUT_POINTS_KEY)
        if recorded:
            points.extend(str(point) for point in recorded)
        else:
            points.append(event["cursor_to"])
    return tuple(points)
