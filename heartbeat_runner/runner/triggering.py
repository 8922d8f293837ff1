"""Step 4 of a tick: request the runs of the ready jobs, of operators' asks and of due event-time windows, each
recorded before any jobs API call (runner/tick.py has the order that makes a crash anywhere safe).

Invariants:

- every TRIGGER_REQUESTED of a round goes into one commit before the jobs API is called for any of them, with an
  idempotency token derived from recorded events only (a crash replays the same token: no second run);
- requests an earlier tick recorded without a run id are resumed first and in order, with their tokens;
- every answer of a round goes into one commit after the calls; a request the tick's API budget left out stays
  recorded and is resumed next tick;
- the trigger holds (policies/trigger_shaping.py) decide before any request is recorded: a held run waits in
  its rows, untouched.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.records import (
    BLOCKED_STATUSES,
    Event,
    EventType,
    JobStatus,
    as_utc,
    idempotency_token,
    job_parameters,
    skipped_token,
    utcnow,
)
from heartbeat_runner.jobs.base import LIMIT_BACKOFF, SKIP_BACKOFF_KEY, SKIP_CODE_KEY, TriggerRequest
from heartbeat_runner.jobs.calls import ApiBudget, call_all
from heartbeat_runner.lakehouse.store import ControlRow, ReadyRow, TriggerAsk, in_job_order
from heartbeat_runner.policies.event_windows import source_grains
from heartbeat_runner.policies.trigger_shaping import RELEASE_KEY, Candidate, Decisions, ReleaseReason, hold_decisions
from heartbeat_runner.runner.empty_reads import ASKS, SKIPS
from heartbeat_runner.runner.tick_parts import TickParts
from heartbeat_runner.runner.tick_result import JobProblem, TickResult, TriggeredJob, tick_event

log = logging.getLogger(__name__)

#: tokens of one request's chain (see skipped_token) read in one query
SKIP_CHAIN = 8


@dataclass(frozen=True)
class TrackedJobs:
    """The jobs the control table, as built for triggering, holds IN_PROGRESS or FAILED, read once per tick: the
    triggering step resumes ``resumed`` and the reconciliation step looks after the rest (the table is not
    built in between, so one read serves both)."""

    in_progress: list[ControlRow]
    #: the blocked jobs: FAILED, and REFUSED (the jobs service would not run them: retried only when asked)
    failed: list[ControlRow]
    #: recorded requests that never got a run id (a crash, an unknown outcome, the API budget), in job order:
    #: resumed with the same token, so no second run
    resumed: list[TriggerRequest]

    def running(self, just_triggered: list[str]) -> list[ControlRow]:
        """The in-progress jobs with a run to look up (not the ones this tick started)."""
        return [row for row in self.in_progress if row.trigger_job_id not in just_triggered and row.job_run_id]


@dataclass(frozen=True)
class Wanted:
    """A run this tick requests: a ready job's (the dependency rule) or one an operator asked for."""

    job_id: str
    job_name: str | None
    rows: list[ReadyRow]      # the rows whose pending data it consumes (none: a manual run over nothing new)
    consumed: list[str]       # the NEW_DATA event ids it consumes
    ask: TriggerAsk | None = None
    #: how many earlier asks of the same data had their runs skipped (see Triggering.past_skips)
    attempt: int = 0
    #: why the trigger holds let it start (policies/trigger_shaping.py); empty without trigger shaping
    released: tuple[ReleaseReason, ...] = ()

    @property
    def first_token(self) -> str:
        """Job id + consumed events; a manual run adds its ask, so it never repeats another run's token."""
        return idempotency_token(self.job_id, self.consumed + ([f"ask:{self.ask.ask_event_id}"] if self.ask else []))

    @property
    def token(self) -> str:
        """The token of this ask: the first, or the next of its chain after skipped runs."""
        return skipped_token(self.first_token, self.attempt)

    @property
    def message(self) -> str | None:
        if self.ask is None:
            return None
        return (f"manual run asked by {self.ask.by}" + (f" ({self.ask.reason})" if self.ask.reason else "")
                + (f"; consumes {len(self.consumed)} pending event(s)" if self.consumed else "; nothing new pending"))


def _consumed(event_ids: str) -> list[str]:
    return [i for i in event_ids.split(",") if i]


class Triggering:
    """Step 4 of every tick of one runner (module docstring: its invariants)."""

    def __init__(self, parts: TickParts):
        self.parts = parts
        #: the window and trigger policies were copied to their tables (once per runner)
        self._windows_synced = False

    def trigger_ready(self, result: TickResult, budget: ApiBudget, ready: list[ReadyRow],
                      carried: list[TriggerRequest], running: list[str] | None = None, *, asks: bool = True) -> None:
        """Step 4: resume ``carried`` (requests earlier ticks recorded without a run id), first and in order,
        and request the runs of the ready jobs and of operators' asks (unless ``asks`` is False), all in one
        round of API calls. With trigger shaping, only the wanted runs every hold allows (``_shaped``;
        ``running``: the jobs in progress)."""
        by_job: dict[str, list[ReadyRow]] = defaultdict(list)
        for row in ready:
            by_job[row.trigger_job_id].append(row)
        if carried:
            self.parts.progress(f"resuming {len(carried)} trigger request(s) left by an earlier tick")
        wanted = [Wanted(job_id, rows[0].trigger_job_name, rows, _consumed(rows[0].consumed_event_ids))
                  for job_id, rows in by_job.items()]
        if asks:
            wanted += self._manual_runs(set(by_job) | {request.job_id for request in carried})
        wanted = self._shaped(wanted, running or [], result)
        wanted = self._past_skips(wanted, result)
        if not wanted:
            if carried:
                self._request_runs(result, budget, [], carried)
            return
        planned: list[tuple[Wanted, TriggerRequest, dict[str, Any]]] = []
        events = self.parts.store.new_data_events(sorted({i for want in wanted for i in want.consumed}))
        for want in wanted:
            try:
                planned.append((want, *self._request_for(want, result.run_id, events)))
            except SourceError as exc:  # a catch-up policy the source cannot apply: this job waits
                result.trigger_errors.append(JobProblem(want.job_id, f"catch-up plan: {exc}"))
        result.manual.update({want.job_id: note for want, _, _ in planned if (note := want.message)})
        self._request_runs(result, budget, [self._requested_event(result, req, payload,
                                                                  ",".join(want.consumed) or None, want.message)
                                            for want, req, payload in planned],
                           carried + [req for _, req, _ in planned])

    def holds(self, candidates: list[Candidate], running: list[str], result: TickResult) -> Decisions:
        """The trigger holds' decisions on ``candidates`` now (policies/trigger_shaping.py), the held ones noted
        in ``result.held``. The facts they read come from heartbeat_job_trigger_facts, one query."""
        facts = self.parts.store.trigger_facts([c.job_id for c in candidates])
        candidates = [c.with_facts(facts.get(c.job_id, {})) for c in candidates]
        decisions = hold_decisions(self.parts.shaping, candidates, running, utcnow())
        for job_id, hold in decisions.held.items():
            log.info("job %s %s", job_id, hold.describe(), extra={"job": job_id})
            result.held.append(JobProblem(job_id, hold.describe()))
            result.held_by[job_id] = hold.kind
            if hold.until is not None and (result.release_at is None or hold.until < result.release_at):
                result.release_at = hold.until
        return decisions

    def _shaped(self, wanted: list[Wanted], running: list[str], result: TickResult) -> list[Wanted]:
        """The wanted runs that every trigger hold allows now, each with its release reasons (recorded with its
        request); the others wait in their rows, untouched, for a later tick. Unchanged without trigger shaping.

        This is the hold rule's one Python step (the reasons it is not a SQL view are in
        policies/trigger_shaping.py's docstring): applied to the rows of jobs_ready_to_trigger and to operators'
        asks, after the dependency rule and before any request is recorded."""
        shaped = [want for want in wanted if self.parts.shaping.for_job(want.job_id) is not None]
        if not shaped:
            return wanted
        # an operator's ask for a job that is ready anyway is that job's run (it consumes the same rows): it
        # skips the time holds as any operator's run does
        asks = {} if self.parts.empty.still_empty(ASKS) else self.parts.store.trigger_asks()
        wanted = [replace(want, ask=asks[want.job_id]) if want.ask is None and want.job_id in asks
                  and self.parts.shaping.for_job(want.job_id) is not None else want for want in wanted]
        shaped = [want for want in wanted if self.parts.shaping.for_job(want.job_id) is not None]
        decisions = self.holds([Candidate(want.job_id, operator=want.ask is not None) for want in shaped],
                                running, result)
        return [replace(want, released=decisions.released.get(want.job_id, ())) for want in wanted
                if want.job_id not in decisions.held]

    def _past_skips(self, wanted: list[Wanted], result: TickResult | None = None) -> list[Wanted]:
        """Each wanted run with the first token of its chain (``skipped_token``) whose run was not skipped: the
        same data asked again after a skipped run gets a new token (the old one would hand back the skipped
        run), derived from recorded events only, so a crash replays it.

        A run a workspace limit skipped (its RUN_SKIPPED event says ``backoff``) holds its data back until
        ``LIMIT_BACKOFF.after(n)`` has passed since that skip, n the skipped runs of the same data so far: such
        a want is left out of this tick and noted in ``result.runs_deferred`` (and the metrics)."""
        attempts = self._skip_attempts([want.first_token for want in wanted])
        wanted = [replace(want, attempt=attempts.get(want.first_token, 0)) for want in wanted]
        skipped = {skipped_token(want.first_token, want.attempt - 1): want for want in wanted if want.attempt}
        if not skipped:
            return wanted
        now, held = utcnow(), set()
        for token, (skipped_at, payload) in self.parts.store.skip_events(sorted(skipped)).items():
            want = skipped[token]
            if not payload.get(SKIP_BACKOFF_KEY):
                continue
            due = as_utc(skipped_at) + timedelta(seconds=LIMIT_BACKOFF.after(want.attempt))
            if now < due:
                held.add(want.first_token)
                code = str(payload.get(SKIP_CODE_KEY) or "SKIPPED")
                if result is not None:
                    result.runs_deferred.append(JobProblem(want.job_id, (
                        f"its last run was skipped for a workspace limit ({code}, {want.attempt} skipped run(s) of "
                        f"this data); asked again after {due.isoformat(timespec='seconds')}")))
                    result.not_executed[(code, "deferred")] += 1
        return [want for want in wanted if want.first_token not in held]

    def _skip_attempts(self, tokens: list[str]) -> dict[str, int]:
        """For each first token, the first attempt of its chain whose run was not skipped (0: the token itself).
        The chains are read ``SKIP_CHAIN`` tokens at a time, and only while the events hold a skipped run at all
        (that is read again only when a process committed since the last read that found none: EmptyReads)."""
        if not tokens or self.parts.empty.still_empty(SKIPS):
            return {}
        any_skipped = self.parts.store.any_skipped()
        self.parts.empty.found(SKIPS, empty=not any_skipped)
        if not any_skipped:
            return {}
        attempts: dict[str, int] = {}
        left, start = sorted(set(tokens)), 0
        while left:
            chains = {t: [skipped_token(t, n) for n in range(start, start + SKIP_CHAIN)] for t in left}
            skipped = self.parts.store.skipped_tokens(sorted({t for chain in chains.values() for t in chain}))
            for token, chain in chains.items():
                free = next((n for n, t in enumerate(chain) if t not in skipped), None)
                if free is not None:
                    attempts[token] = start + free
            left, start = [t for t in left if t not in attempts], start + SKIP_CHAIN
        return attempts

    def _manual_runs(self, exclude: set[str]) -> list[Wanted]:
        """The runs operators asked for (``trigger``) that no other request of this tick covers. The asks are
        read again only when another process committed since the last read that found none (see EmptyReads:
        idle ticks and the runner's own commits leave them unread); an ask is an event, so a new one is
        always such a commit."""
        if self.parts.empty.still_empty(ASKS):
            return []
        found = self.parts.store.trigger_asks()
        self.parts.empty.found(ASKS, empty=not found)
        asks = {job: ask for job, ask in found.items() if job not in exclude}
        if not asks:
            return []
        return [Wanted(run.trigger_job_id, run.trigger_job_name, run.rows, run.consumed_event_ids,
                       ask=asks[run.trigger_job_id])
                for run in self.parts.store.manual_runs(sorted(asks))]

    def tracked_jobs(self) -> TrackedJobs:
        """The jobs in progress and the failed ones, and the recorded requests among them that never got a run
        id (their parameters in one query)."""
        jobs = self.parts.store.jobs_by_status(JobStatus.IN_PROGRESS, *BLOCKED_STATUSES)
        in_progress = jobs[JobStatus.IN_PROGRESS]
        unanswered = [(row, token) for row in in_progress
                      if row.job_run_id is None and (token := row.last_idempotency_token)]
        payloads = self.parts.store.trigger_payloads([token for _, token in unanswered])
        resumed = [TriggerRequest(row.trigger_job_id, row.trigger_job_name, token, payloads.get(token, {}))
                   for row, token in unanswered]
        return TrackedJobs(in_progress, in_job_order(jobs, BLOCKED_STATUSES), resumed)

    def _requested_event(self, result: TickResult, request: TriggerRequest, payload: dict[str, Any],
                         consumed_event_ids: str | None = None, message: str | None = None) -> Event:
        """The TRIGGER_REQUESTED event of ``request``, with the payload recorded for it."""
        return Event(event_type=EventType.TRIGGER_REQUESTED, run_id=result.run_id, snapshot_ts=result.snapshot_ts,
                     trigger_job_id=request.job_id, idempotency_token=request.idempotency_token,
                     consumed_event_ids=consumed_event_ids, payload=json.dumps(payload, sort_keys=True),
                     message=message)

    def _request_runs(self, result: TickResult, budget: ApiBudget, events: list[Event],
                      requests: list[TriggerRequest]) -> None:
        """Record ``events`` (the new requests among them) in one commit, then call the jobs API for ``requests``
        (earlier requests carried over first)."""
        if not events and not requests:
            return
        self.parts.before_trigger()
        self.parts.append(result, events)
        crash_point(FaultPoint.AFTER_TRIGGER_REQUESTED)
        if requests:
            self.parts.progress(f"triggering {len(requests)} job(s)")
            self.call_backend(requests, result, budget)

    def prepare_windows(self) -> None:
        """Copy the window policies to their table (once per runner) and tell sensing which sources'
        event times to record, in buckets of the smallest window size reading each."""
        windows = self.parts.sequences.windows
        if not self._windows_synced:
            self.parts.store.sync_window_policies({job: (p.size_s, p.lateness_s, p.late_data.value)
                                             for job, p in windows.items()})
            # the trigger policies too (a job with a quiet period keeps sensing while its data waits); the jobs of
            # the config at the runner's start (a job added to a running loop gets its default at the next start)
            jobs = {r["trigger_job_id"] for r in self.parts.store.control_rows()} if self.parts.shaping.enabled else set()
            self.parts.store.sync_trigger_policies(self.parts.shaping.table_rows(jobs))
            self._windows_synced = True
        if windows:
            pairs = [(r["trigger_job_id"], r["source_key"]) for r in self.parts.store.control_rows()]
            self.parts.ctx.event_time_grains = source_grains(windows, pairs)

    def trigger_windows(self, result: TickResult, budget: ApiBudget) -> None:
        """Step 4 for jobs with an event-time window policy: each final window runs once, in order
        (a sequence), empty ones are skipped and recorded; late rows may earn a window one correction run."""
        if not self.parts.sequences.windows:
            return
        plans = self.parts.sequences.window_plans(result.run_id, result.snapshot_ts)
        planned = {p.job_id for p in plans}
        for job_id in self.parts.store.windowed_jobs_free():
            correction = None if job_id in planned else self.parts.sequences.correction(job_id, result.run_id)
            if correction is not None:
                plans.append(correction)
        requested = [(p.request, p.payload) for p in plans if p.request is not None]
        events = [e for p in plans for e in p.skipped] + [
            self._requested_event(result, request, payload) for request, payload in requested]
        if events:
            self._request_runs(result, budget, events, [request for request, _ in requested])

    def _request_for(self, want: Wanted, run_id: str, events: list[dict]) -> tuple[TriggerRequest, dict[str, Any]]:
        """The request of a wanted run and the payload recorded with it (its parameters, and the plan of a
        catch-up sequence when its policy cuts the backlog into several runs)."""
        token = want.token
        payload = self.parts.sequences.first_request(want.job_id, want.rows, token, {"heartbeat_run_id": run_id}, events)
        if want.released:
            payload[RELEASE_KEY] = [reason.value for reason in want.released]
        return TriggerRequest(job_id=want.job_id, job_name=want.job_name, idempotency_token=token,
                              parameters=job_parameters(payload)), payload

    def call_backend(self, requests: list[TriggerRequest], result: TickResult, budget: ApiBudget) -> None:
        """Call the jobs API for the (recorded) requests on the pool, within the tick's budget, and record
        every answer in one commit. A request that did not start, or whose outcome is unknown, stays
        recorded without a run id: the next tick resumes it with the same token (no second run)."""
        calls = call_all(requests, self.parts.backend.trigger, budget, on_answer=_trigger_crash_points(len(requests)))
        answers: list[Event] = []
        for answer in calls.answers:
            request, exc = answer.item, answer.error
            if exc is not None:
                result.trigger_errors.append(JobProblem(request.job_id, str(exc)))
                if exc.retryable:
                    log.warning("trigger of %s will be retried: %s", request.job_id, exc, extra={"job": request.job_id})
                    continue
                answers.append(tick_event(result, EventType.TRIGGER_ERROR, request.job_id,
                                           idempotency_token=request.idempotency_token, message=str(exc)))
                continue
            run_id = str(answer.value)
            log.info("triggered %s (run %s)", request.job_id, run_id, extra={"job": request.job_id})
            result.triggered.append(TriggeredJob(request.job_id, run_id))
            answers.append(tick_event(result, EventType.TRIGGERED, request.job_id, job_run_id=run_id,
                                       idempotency_token=request.idempotency_token))
        if calls.not_started:
            result.carried += [request.job_id for request in calls.not_started]
            log.warning("%d trigger request(s) did not fit the tick's jobs API budget; next tick resumes them",
                        len(calls.not_started))
        self.parts.append(result, answers)
        crash_point(FaultPoint.AFTER_TRIGGERED)

    def past_skipped_retries(self, retries: list[TriggerRequest]) -> list[TriggerRequest]:
        """A retry whose run was skipped is asked again with the next token of its chain, as a first request is
        (the same token would hand back the skipped run)."""
        attempts = self._skip_attempts([retry.idempotency_token for retry in retries])
        return [replace(retry, idempotency_token=skipped_token(retry.idempotency_token,
                                                               attempts.get(retry.idempotency_token, 0)))
                for retry in retries]


def _trigger_crash_points(calls: int) -> Callable[[int], None]:
    """Crash points among the parallel trigger calls: after the first answer, and after half of them."""
    def on_answer(answered: int) -> None:
        if answered == 1:
            crash_point(FaultPoint.AFTER_TRIGGER_CALL)
        if answered == (calls + 1) // 2:
            crash_point(FaultPoint.DURING_TRIGGER_CALLS)
    return on_answer
