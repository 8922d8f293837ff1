"""Bounded catch-up: a job's backlog becomes a sequence of runs, each over at most ``max_window``.

A job that was paused or failing for a week wakes up to a week of data. With a catch-up
policy its next trigger covers only the oldest piece of each source's backlog; when that
run succeeds the next piece is requested (NEXT_WINDOW_REQUESTED), and so on, oldest
first, until the backlog is consumed. The trigger request that starts the sequence
consumes the whole backlog (as any trigger does) and records the plan, so the pieces are
fixed once: a crash anywhere in the sequence neither skips nor repeats a window.

The policy lives in the run-policy YAML beside the retry policy::

    jobs:
      "123": {max_retries: 2, catch_up: {max_window: 7d}}      # a key span (date/timestamp key)
      "456": {catch_up: {max_window: 10}}                        # 10 Delta versions / Kafka offsets

Pure functions and records only; the sources cut their own windows (``Source.split``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heartbeat_runner.core.windows import SourceWindow, WindowBounds, WindowLimit
from heartbeat_runner.policies.run_policy_file import check_section, policy_sections

#: The keys of the run-policy YAML's per-job mapping that are a catch-up policy.
CATCH_UP_KEYS = {"max_window", "max_in_flight"}
#: Payload keys of a sequence request that are Heartbeat's own (not sent to the job).
PLAN_KEY, RUN_KEY, RUNS_KEY, EXTRA_KEY = "_plan", "_run", "_runs", "_extra"
#: The job parameter with the run's windows as JSON (README, "Job parameters") and its schema's version.
PARAMS_KEY, PARAMS_VERSION = "heartbeat_params", 1
#: One source's part of a run in the job's terms (``Source.bounds``, by the policies that know the sources).
Bounds = Callable[[SourceWindow], WindowBounds]


def window_parameters(base: Mapping[str, str], windows: Sequence[SourceWindow], bounds: Bounds,
                      own: Mapping[str, str], rows: Mapping[str, int | None] | None = None) -> dict[str, str]:
    """What a job receives for a run over ``windows``: ``base`` (the tick's run id), ``heartbeat_windows``
    (text bounds, for people) and ``heartbeat_params`` (the same as JSON, versioned), and ``own`` (an
    event-time window's bounds, a catch-up run's position). ``rows``: new rows per ``sensor_source:sensor_id``
    when known (a catch-up run's piece does not know its count)."""
    window = {"start": own["window_start"], "end": own["window_end"],
              "correction": own.get("heartbeat_window_correction") == "true"} if "window_start" in own else None
    sources = [{"sensor_source": w.sensor_source, "sensor_id": w.sensor_id,
                **(WindowBounds("event_time", w.window_from, w.window_to) if window else bounds(w)).payload(),
                "rows": (rows or {}).get(f"{w.sensor_source}:{w.sensor_id}"),
                "from_text": w.window_from, "until_text": w.window_to} for w in windows]
    catch_up = json.loads(own["heartbeat_catch_up"]) if "heartbeat_catch_up" in own else None
    structured = {"version": PARAMS_VERSION, "run_id": base.get("heartbeat_run_id"), "sources": sources,
                  "window": window, "catch_up": catch_up}
    return {**base, "heartbeat_windows": json.dumps([w.parameter() for w in windows], sort_keys=True),
            PARAMS_KEY: json.dumps(structured, sort_keys=True), **own}


@dataclass(frozen=True)
class CatchUpPolicy:
    max_window: WindowLimit
    #: runs of one sequence in flight at once; only 1 (strictly one after the other) is supported
    max_in_flight: int = 1

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> CatchUpPolicy:
        check_section("catch_up", values, CATCH_UP_KEYS, "max_window", "a count such as 10, or a span such as 7d")
        in_flight = int(values.get("max_in_flight", 1))
        if in_flight != 1:
            raise ValueError(f"catch_up max_in_flight {in_flight}: only 1 is supported (each run of the "
                             "sequence starts after the previous one succeeded)")
        return cls(WindowLimit.parse(values["max_window"]), in_flight)


@dataclass(frozen=True)
class SequencePlan:
    """The runs a backlog becomes, oldest first; run k (1-based) covers ``runs[k-1]``.

    ``extra[k-1]``, when given, are parameters of run k of their own (an event-time window's
    ``window_start``/``window_end``); without them a run is a catch-up run and says so.
    """

    runs: list[list[SourceWindow]] = field(default_factory=list)
    extra: list[dict[str, str]] = field(default_factory=list)

    def parameters(self, run: int, base: Mapping[str, str], bounds: Bounds) -> dict[str, Any]:
        """The payload of run ``run``: the job's parameters plus the plan (private keys, not sent)."""
        own = self.extra[run - 1] if self.extra else {
            "heartbeat_catch_up": json.dumps({"run": run, "runs": len(self.runs)}, sort_keys=True)}
        return {**window_parameters(base, self.runs[run - 1], bounds, own),
                RUN_KEY: run, RUNS_KEY: len(self.runs), PLAN_KEY: self.dump(), EXTRA_KEY: self.extra}

    def dump(self) -> list[list[dict[str, str | None]]]:
        return [[w.record() for w in run] for run in self.runs]

    @classmethod
    def load(cls, payload: Mapping[str, Any]) -> SequencePlan | None:
        """The plan a request's payload recorded, or None for a plain request."""
        runs = payload.get(PLAN_KEY)
        if not runs:
            return None
        return cls([[SourceWindow(**w) for w in run] for run in runs], list(payload.get(EXTRA_KEY) or []))


def plan_sequence(pieces: Mapping[str, list[SourceWindow]]) -> SequencePlan:
    """Runs from each source's pieces: run k takes the k-th piece of every source that has one."""
    depth = max((len(p) for p in pieces.values()), default=0)
    return SequencePlan([[p[k] for _, p in sorted(pieces.items()) if k < len(p)] for k in range(depth)])


def next_window_token(base_token: str, run: int) -> str:
    """Idempotency token of run ``run`` of a sequence started by ``base_token``: deterministic and distinct."""
    if run <= 1:
        return base_token
    return hashlib.sha256(f"{base_token}\x1fwindow\x1f{run}".encode()).hexdigest()[:36]


def catch_up_policies(data: Mapping[str, Any]) -> dict[str, CatchUpPolicy]:
    """``jobs: {<job id>: {catch_up: {...}}}`` of a run-policy mapping (``default`` may hold one too)."""
    return policy_sections(data, "catch_up", CatchUpPolicy.from_mapping)


def policy_for(policies: Mapping[str, CatchUpPolicy], job_id: str) -> CatchUpPolicy | None:
    return policies.get(job_id, policies.get("*"))
