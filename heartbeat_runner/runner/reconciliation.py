"""Step 5 of a tick: look after the runs in progress and the failed jobs, in one call to the jobs backend, and
record what it found; then request the retries and the next runs of sequences that this made due.

Invariants:

- a finished run's event, a recovery, and the retry and next-run requests it makes due go into one commit,
  before the jobs API is called for those requests (their tokens derive from recorded events: a crash between
  the commit and the call replays the same tokens);
- a run the jobs service skipped voids its request (its data is asked for again with a new token, after a
  back-off for a workspace limit); a refused run is a terminal non-run (REFUSED: its own event and status) that
  blocks the job until an operator's retry, never retried by the job's policy;
- one failure gets at most one retry, decided by the job's policy or an operator's ``retry``, and the trigger
  holds decide retries as they decide first runs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import timedelta

from heartbeat_runner.core.errors import JobsBackendError
from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.records import Event, EventType, JobStatus, utcnow
from heartbeat_runner.jobs.base import (
    REFUSED_PREFIX,
    SKIP_BACKOFF_KEY,
    SKIP_CODE_KEY,
    FailedJob,
    Reconciliation,
    RunOutcome,
    RunRef,
    RunStatus,
    TriggerRequest,
)
from heartbeat_runner.jobs.calls import ApiBudget
from heartbeat_runner.lakehouse.store import ControlRow, RetryAsk
from heartbeat_runner.policies.retry import overrun, retry_token
from heartbeat_runner.policies.trigger_shaping import Candidate
from heartbeat_runner.runner.empty_reads import SEQUENCES
from heartbeat_runner.runner.sequences import NextRun
from heartbeat_runner.runner.tick_parts import TickParts
from heartbeat_runner.runner.tick_result import BACKEND_MEMORY, JobProblem, TickResult, tick_event
from heartbeat_runner.runner.triggering import TrackedJobs, Triggering

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class FollowUps:
    """What reconciliation found: the events to record in one commit (finished runs, recoveries, the retry
    requests and the next runs of sequences), and the runs to request once they are recorded."""

    events: list[Event]
    retries: list[TriggerRequest]
    next_runs: list[NextRun]

    @property
    def requests(self) -> list[TriggerRequest]:
        return self.retries + [step.request for step in self.next_runs]


class Reconciler:
    """Step 5 of every tick of one runner (module docstring: its invariants)."""

    def __init__(self, parts: TickParts, triggering: Triggering):
        self.parts = parts
        self.triggering = triggering
        #: the jobs backend was handed the memory of the latest run summary (once per process)
        self._backend_recalled = False

    def reconcile(self, result: TickResult, budget: ApiBudget, jobs: TrackedJobs) -> FollowUps:
        """Step 5: ask the jobs backend about the running jobs and the failed ones; the events of what it found,
        and the retries and next runs of sequences due now (requested by :meth:`_request_follow_ups`)."""
        tracked = jobs.running(result.triggered_job_ids)
        failed = jobs.failed
        if failed:
            self._recall_backend()
        found = self._reconciliation(tracked, failed, result, budget)
        events: list[Event] = []
        next_runs = self._sequences_due(result)
        for row in tracked:
            status = found.statuses.get(row.job_run_id or "")
            finished = self._finished_run_events(row, status, result) if status is not None else []
            events.extend(finished)
            next_runs.extend(self._next_run(row, finished, result))
        retries: list[TriggerRequest] = []
        asks = self.parts.store.retry_asks() if failed else {}
        due: list[tuple[ControlRow, RetryAsk | None, TriggerRequest]] = []
        for row in failed:
            recovered = self._recovery_events(row, found.recovered.get(row.trigger_job_id), result)
            ask = asks.get(row.trigger_job_id)
            retry = None if recovered or row.trigger_job_id in found.deferred else self._retry_request(row, ask)
            if retry is not None:
                (retry,) = self.triggering.past_skipped_retries([retry])
                due.append((row, ask, retry))
            events.extend(recovered)
            next_runs.extend(self._next_run(row, recovered, result))
        for row, ask, retry in self._shaped_retries(due, jobs, result):
            if retry is not None:
                retries.append(retry)
                result.retried.append(row.trigger_job_id)
                events.append(tick_event(result, EventType.RETRY_REQUESTED, row.trigger_job_id,
                                          idempotency_token=retry.idempotency_token,
                                          payload=json.dumps(retry.parameters, sort_keys=True),
                                          message=_retry_message(row, ask)))
        # the next run of a sequence goes into the same commit as the success before it, unless a hold keeps it
        next_runs = self._shaped_next_runs(next_runs, jobs, result)
        events.extend(step.event for step in next_runs)
        return FollowUps(events, retries, next_runs)

    def _shaped_retries(self, due: list[tuple[ControlRow, RetryAsk | None, TriggerRequest]], jobs: TrackedJobs,
                        result: TickResult) -> list[tuple[ControlRow, RetryAsk | None, TriggerRequest]]:
        """The retries due now that the trigger holds allow: an operator's ``retry`` counts against the pool
        only, an automatic one keeps the minimum interval too; a held retry is decided again next tick."""
        held = self._held([Candidate(row.trigger_job_id, operator=ask is not None, follow_up=ask is None)
                           for row, ask, _ in due], jobs, result)
        return [item for item in due if item[0].trigger_job_id not in held]

    def _shaped_next_runs(self, next_runs: list[NextRun], jobs: TrackedJobs, result: TickResult) -> list[NextRun]:
        """The next runs of bounded catch-up sequences that the trigger holds allow (event-time windows are
        planned apart, in the triggering step, and not held): like an automatic retry, a next run keeps the
        minimum interval and the pool. A held one is not recorded now; its sequence stays due in
        heartbeat_job_sequences (its latest run succeeded, runs are left), so the next tick reads the due
        sequences again and decides it anew, with the same token whenever it goes."""
        held = self._held([Candidate(step.request.job_id, follow_up=True) for step in next_runs], jobs, result)
        if held:
            self.parts.empty.found(SEQUENCES, empty=False)  # read the due sequences again next tick
        return [step for step in next_runs if step.request.job_id not in held]

    def _held(self, candidates: list[Candidate], jobs: TrackedJobs, result: TickResult) -> frozenset[str]:
        """The jobs among ``candidates`` that a trigger hold (minimum interval, quiet period, cron gate, pool)
        keeps back this tick; none asked when no candidate's job is shaped."""
        shaped = [candidate for candidate in candidates if self.parts.shaping.for_job(candidate.job_id) is not None]
        if not shaped:
            return frozenset()
        return frozenset(self.triggering.holds(shaped, _running_after(jobs, result), result).held)

    def request_follow_ups(self, result: TickResult, budget: ApiBudget, follow_ups: FollowUps) -> None:
        """Record what reconciliation found in one commit, then call the jobs API for the retries and next runs
        recorded in it (the same tokens on a replay after a crash in between)."""
        self.parts.append(result, follow_ups.events)
        if follow_ups.next_runs:
            crash_point(FaultPoint.AFTER_NEXT_WINDOW_REQUESTED)
        if follow_ups.retries:
            crash_point(FaultPoint.AFTER_RETRY_REQUESTED)
        if follow_ups.requests:
            self.parts.before_trigger()
            self.triggering.call_backend(follow_ups.requests, result, budget)

    def _sequences_due(self, result: TickResult) -> list[NextRun]:
        """Next runs of sequences whose run succeeded without the runner recording it (a job's own `complete`):
        read again only when another process committed since the last read that found none."""
        if self.parts.empty.still_empty(SEQUENCES):
            return []
        due = self.parts.sequences.due(result.run_id, result.snapshot_ts)
        self.parts.empty.found(SEQUENCES, empty=not due)
        return due

    def _reconciliation(self, tracked: list[ControlRow], failed: list[ControlRow], result: TickResult,
                        budget: ApiBudget) -> Reconciliation:
        """Ask the backend, in one call, about the tracked runs and the failed jobs; note what it could not do."""
        found = self.parts.backend.reconcile(
            [RunRef(row.trigger_job_id, row.job_run_id) for row in tracked if row.job_run_id],
            [FailedJob(row.trigger_job_id, since, row.job_run_id) for row in failed
             if (since := row.job_end_timestamp or row.status_change_timestamp) is not None],
            budget)
        result.trigger_errors += [JobProblem(p.job_id, p.message) for p in found.problems]
        result.carried += found.deferred
        result.api_notes += found.notes
        return found

    def _next_run(self, row: ControlRow, finished: list[Event], result: TickResult) -> list[NextRun]:
        """The next run of the job's catch-up sequence if ``finished`` records its current run's success."""
        if not any(e.event_type is EventType.COMPLETED for e in finished):
            return []
        step = self.parts.sequences.after_success(row.trigger_job_id, row.trigger_job_name, row.base_idempotency_token,
                                            result.run_id, result.snapshot_ts)
        return [step] if step is not None else []

    def _request(self, row: ControlRow, token: str) -> TriggerRequest:
        """Rebuild the recorded request of ``row`` with idempotency token ``token``."""
        return TriggerRequest(row.trigger_job_id, row.trigger_job_name, token, self.parts.store.trigger_payload(token))

    def _retry_request(self, row: ControlRow, ask: RetryAsk | None) -> TriggerRequest | None:
        """The retry of a failed job due now (same data, new token): asked for by an operator, or due by
        the job's policy (never for a REFUSED job: the jobs service would refuse it again until someone fixes
        the cause). Both derive the token from the failures so far, so a crash between recording the retry and
        calling the API replays the same token, and one failure gets at most one retry."""
        if row.base_idempotency_token is None or row.job_end_timestamp is None:
            return None
        if ask is None and row.status is JobStatus.REFUSED:
            return None
        if ask is None:
            policy = self.parts.policies.for_job(row.trigger_job_id)
            if not policy.enabled or not policy.decide(row.consecutive_failures, row.job_end_timestamp,
                                                       utcnow()).retry_now:
                return None
        base = self._request(row, row.base_idempotency_token)
        return replace(base, idempotency_token=retry_token(base.idempotency_token, row.consecutive_failures))

    def _report_overrun(self, row: ControlRow, run_id: str, status: RunStatus, result: TickResult) -> None:
        """Report (and optionally cancel) run ``run_id`` of ``row`` going on for longer than the configured maximum."""
        limit = self.parts.settings.max_run_duration_s
        over = overrun(status, timedelta(seconds=limit) if limit else None, utcnow())
        if over is None:
            return
        message = f"run {run_id} is {over} past its maximum duration of {limit:g}s"
        if self.parts.settings.cancel_overdue_runs and self.parts.backend.can_cancel:
            try:
                self.parts.backend.cancel_run(row.trigger_job_id, run_id)
                message += "; cancelled"
            except JobsBackendError as exc:
                message += f"; cancelling failed: {exc}"
        log.warning("job %s: %s", row.trigger_job_id, message)
        result.overdue.append(JobProblem(row.trigger_job_id, message))

    def _finished_run_events(self, row: ControlRow, status: RunStatus, result: TickResult) -> list[Event]:
        """Events for the row's run (``status``) if it has finished; report it if overdue."""
        run_id = status.run_id
        if not status.outcome.finished:
            self._report_overrun(row, run_id, status, result)
            return []
        if status.outcome is RunOutcome.SKIPPED:
            # the run never executed: its request is void (heartbeat_in_lifecycle), the data it consumed is
            # pending again, and a later tick asks with a new token (Triggering._past_skips), after a back-off when a
            # workspace limit stopped it
            code = status.code or "SKIPPED"
            later = "after a back-off (workspace limit)" if status.backoff else "at a later tick"
            note = f"run {run_id} was skipped ({status.message}); its data is asked for again {later}"
            result.runs_skipped.append(JobProblem(row.trigger_job_id, note))
            result.not_executed[(code, "limited" if status.backoff else "skipped")] += 1
            payload = {**status.timing(), SKIP_CODE_KEY: code, SKIP_BACKOFF_KEY: status.backoff}
            return [tick_event(result, EventType.RUN_SKIPPED, row.trigger_job_id, job_run_id=run_id,
                                idempotency_token=row.last_idempotency_token, message=status.message,
                                payload=json.dumps(payload))]
        if status.outcome is RunOutcome.REFUSED:
            # a terminal non-run: the job is REFUSED (its own status, a JOB_REFUSED alert), blocked until an
            # operator's retry and never retried by its policy; its own words say it never ran and what to do
            code = status.code or "REFUSED"
            refusal = (f"{REFUSED_PREFIX} ({status.message}); the job waits until the cause is fixed in the "
                       "workspace, then `retry`")
            log.warning("job %s: run %s %s", row.trigger_job_id, run_id, refusal)
            result.failed.append(row.trigger_job_id)  # it ended without success...
            result.refused.append(row.trigger_job_id)  # ...as a refusal
            result.not_executed[(code, "refused")] += 1
            if status.end_time is not None:
                result.ended_at[row.trigger_job_id] = status.end_time
            return [tick_event(result, EventType.REFUSED, row.trigger_job_id, job_run_id=run_id, message=refusal,
                                payload=json.dumps({**status.timing(), "refused": code}))]
        success = status.outcome is RunOutcome.SUCCESS
        message: str | None = status.message
        if success and status.partial:
            policy = self.parts.policies.for_job(row.trigger_job_id)
            if not policy.partial_success_counts(status.failed_tasks):
                success = False
                message = (f"{status.message}; counted as failed by the job's policy "
                           f"(success_with_failures: {policy.success_with_failures})")
        (result.completed if success else result.failed).append(row.trigger_job_id)
        if status.end_time is not None:
            result.ended_at[row.trigger_job_id] = status.end_time
        return [tick_event(result, EventType.COMPLETED if success else EventType.FAILED, row.trigger_job_id,
                            job_run_id=run_id, message=message, payload=_timing_payload(status))]

    def _recovery_events(self, row: ControlRow, run: RunStatus | None, result: TickResult) -> list[Event]:
        """A COMPLETED event when ``run``, a successful run after the row's failure, was found."""
        if run is None:
            return []
        result.completed.append(row.trigger_job_id)
        if run.end_time is not None:
            result.ended_at[row.trigger_job_id] = run.end_time
        return [tick_event(result, EventType.COMPLETED, row.trigger_job_id, job_run_id=run.run_id,
                            message=f"successful run {run.run_id} found; job unblocked", payload=_timing_payload(run))]

    def _recall_backend(self) -> None:
        """Once per process, when there are failed jobs to look after: hand the backend the memory the latest
        run summary carries (a process per tick would otherwise start every look afresh)."""
        if self._backend_recalled:
            return
        self._backend_recalled = True
        memory = self.parts.store.latest_run_figures().get(BACKEND_MEMORY)
        if isinstance(memory, dict):
            self.parts.backend.remember(memory)


def _retry_message(row: ControlRow, ask: RetryAsk | None) -> str:
    """The RETRY_REQUESTED event's note: who asked for it, or the policy."""
    if ask is None:
        return f"automatic retry after {row.consecutive_failures} failed run(s)"
    return (f"retry asked by {ask.by}" + (f" ({ask.reason})" if ask.reason else "")
            + f" after {row.consecutive_failures} failed run(s)")


def _timing_payload(status: RunStatus) -> str | None:
    """A run end event's payload: the run's own start, end and queue time (None when the backend knows none)."""
    timing = status.timing()
    return json.dumps(timing) if timing else None


def _running_after(jobs: TrackedJobs, result: TickResult) -> list[str]:
    """The jobs running once this tick's reconciliation is recorded: a run that ended this tick frees its place
    in a pool, a run this tick started takes one."""
    ended = set(result.completed) | set(result.failed)
    return sorted({row.trigger_job_id for row in jobs.in_progress} - ended | set(result.triggered_job_ids))
