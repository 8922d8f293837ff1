"""Alerts (docs/alerts.md): conditions, root cause, delivery to real receivers on loopback, crash safety."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alert_receivers import AlertReceiver, MailReceiver
from databricks_jobs_server import TOKEN, UNAUTHENTICATED, JobsApiServer
from harness import config_row as row

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.core.secrets import SecretKind, SecretRef
from heartbeat_runner.jobs.databricks import DatabricksJobsBackend
from heartbeat_runner.policies.alerts import Deadline
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.senders.destinations import Destination, DestinationKind
from heartbeat_runner.senders.send import AlertAction, Notice, message_id, send

ROOT = Path(__file__).resolve().parent.parent
HOOK_ENV, PD_ENV = "HB_TEST_ALERT_HOOK", "HB_TEST_PD_KEY"
PD_KEY = "R0UT1NGKEYFR0MENV000000000000000"  # a PagerDuty routing key's shape: 32 letters and digits


def policy_file(tmp_path: Path, receiver: AlertReceiver, alerts: str, *, mail: MailReceiver | None = None,
                group: str = "off") -> Path:
    """A run-policy file whose alerts go to the receiver's webhook and PagerDuty endpoints (and the mail server)."""
    email = (f"    mail: {{type: email, host: 127.0.0.1, port: {mail.port}, from: hb@example.com, "
             f"to: [data@example.com], ca_file: '{mail.cert}'}}\n") if mail else ""
    path = tmp_path / "run_policies.yml"
    path.write_text(f"alerts:\n  group_interval: {group}\n  destinations:\n"
                    f"    hook: {{type: webhook, url_env: {HOOK_ENV}}}\n"
                    f"    pager: {{type: pagerduty, routing_key_env: {PD_ENV}, url: '{receiver.url}/v2/enqueue'}}\n"
                    + email + alerts)
    return path


@pytest.fixture
def receiver(monkeypatch):
    with AlertReceiver() as server:
        monkeypatch.setenv(HOOK_ENV, f"{server.url}/hook")
        monkeypatch.setenv(PD_ENV, PD_KEY)
        yield server


def notices(receiver: AlertReceiver) -> list[dict]:
    return [n for body in receiver.hooks() for n in body["alerts"]]


def by_kind(found: list[dict]) -> dict[str, Counter]:
    counts: dict[str, Counter] = {}
    for n in found:
        counts.setdefault(n["kind"], Counter())[n["action"]] += 1
    return counts


def mail_keys(message) -> list[str]:
    """The alert keys an email names (its last line)."""
    body = message.get_payload(decode=True).decode()
    return body.split("Alert keys:")[1].split()


def settle(monitor, timeout: float = 20.0) -> None:
    """Wait until the monitor's outbox has sent everything queued."""
    deadline = time.monotonic() + timeout
    while monitor.outbox.pending() and time.monotonic() < deadline:
        time.sleep(0.05)


# -- the policy section ---------------------------------------------------------------------------

def test_validate_names_every_bad_alert_field(tmp_path):
    path = tmp_path / "p.yml"
    path.write_text("alerts:\n  default:\n    job: {trigger_error_after: soon}\n"
                    "  jobs:\n    '444': {deadline: '25:00 Europe/Berlin'}\n"
                    "  sources:\n    'delta_table:a': {new_data_every: 1h, every: 2h}\n"
                    "  destinations:\n    x: {type: slack}\n    m: {type: email, host: h}\n")
    with pytest.raises(ConfigError) as caught:
        load_run_policies(path)
    text = str(caught.value)
    for field in ("alerts.default.job.trigger_error_after", "alerts.jobs.444.deadline", "alerts.sources.delta_table:a",
                  "alerts.destinations.x.type", "alerts.destinations.m: a email destination needs from, to"):
        assert field in text
    assert str(path) in text
    good = tmp_path / "good.yml"
    good.write_text("default: {max_retries: 1}\nalerts:\n  jobs:\n    '444': {deadline: '06:00 Europe/Berlin'}\n")
    policies = load_run_policies(good)
    assert policies.retry.default.max_retries == 1 and policies.alerts.jobs["444"].deadline == Deadline.parse(
        "06:00 Europe/Berlin", "x")


def test_a_destination_secret_is_a_reference_never_the_value_in_the_file(tmp_path):
    """``url: {secret: scope/key}`` and ``{env: NAME}`` are accepted beside ``url_env``; a URL written in the
    file, a secret without ``scope/key`` or both spellings at once are refused, naming the field."""
    path = tmp_path / "p.yml"
    path.write_text("alerts:\n  destinations:\n"
                    "    a: {type: webhook, url: {secret: heartbeat/hook}}\n"
                    "    b: {type: pagerduty, routing_key: {env: PD_KEY}}\n"
                    "    c: {type: email, host: h, from: f@example.com, to: t@example.com, "
                    "username: {secret: mail/user}, password_env: MAIL_PASSWORD}\n")
    destinations = {d.name: d for d in load_run_policies(path).alerts.destinations}
    assert str(destinations["a"].url_secret) == "{secret: heartbeat/hook}"
    assert str(destinations["b"].routing_key_secret) == "{env: PD_KEY}"
    assert (str(destinations["c"].username_secret), str(destinations["c"].password_secret)) == (
        "{secret: mail/user}", "{env: MAIL_PASSWORD}")
    path.write_text("alerts:\n  destinations:\n"
                    "    w: {type: webhook, url: 'https://hooks.example.com/T0/B0/s3cr3t'}\n"
                    "    s: {type: webhook, url: {secret: no-key}}\n"
                    "    d: {type: pagerduty, routing_key: {env: A}, routing_key_env: B}\n")
    with pytest.raises(ConfigError) as caught:
        load_run_policies(path)
    text = str(caught.value)
    assert "alerts.destinations.w.url: a secret is never written in the file" in text and "s3cr3t" not in text
    assert "alerts.destinations.s.url: {secret: ...} must name a scope and a key" in text and "no-key" not in text
    assert "alerts.destinations.d.routing_key: give routing_key or routing_key_env, not both" in text


def test_a_deadline_is_a_time_of_day_in_its_zone():
    deadline = Deadline.parse("06:00 Europe/Berlin", "d")
    # 05:30 UTC on a winter day is 06:30 in Berlin: today's deadline (05:00 UTC) has passed
    due, start = deadline.latest(datetime(2026, 11, 23, 5, 30, tzinfo=timezone.utc))
    assert due == datetime(2026, 11, 23, 5, 0, tzinfo=timezone.utc)
    assert start == datetime(2026, 11, 22, 23, 0, tzinfo=timezone.utc)  # Berlin midnight
    due, _ = deadline.latest(datetime(2026, 11, 23, 4, 30, tzinfo=timezone.utc))
    assert due == datetime(2026, 11, 22, 5, 0, tzinfo=timezone.utc)   # not yet today: yesterday's
    summer, _ = deadline.latest(datetime(2026, 7, 1, 5, 0, tzinfo=timezone.utc))
    assert summer == datetime(2026, 7, 1, 4, 0, tzinfo=timezone.utc)  # CEST


def test_each_overdue_job_is_its_own_alert_and_a_message_names_their_shared_cause_once():
    """Ten jobs waiting on one late chain: ten alerts, subject the job, each saying the chain's last data; one
    message of them leads with the cause and lists the ten. A job whose run is still going says so; a job
    completed in the period is not overdue. When the chain gets data, each alert's words change, not its key."""
    from heartbeat_runner.policies.alerts import AlertKind, HotState, alert_policies, evaluate
    from heartbeat_runner.runner.alerting import _notice
    from heartbeat_runner.senders.send import digest_text

    now = datetime(2026, 11, 23, 6, 30, tzinfo=timezone.utc)
    policies = alert_policies({"alerts": {"default": {"job": {"deadline": "06:00 Europe/Berlin"}}}})
    state = HotState()
    chain, fx = state.source("sap_b4:CHAIN_X"), state.source("delta_table:fx")
    chain.last_new_data = datetime(2026, 11, 22, 21, 14, tzinfo=timezone.utc)
    fx.last_new_data = now - timedelta(minutes=10)
    waiting = [f"J{i}" for i in range(10)]
    for job in waiting:
        state.job(job).hard_sources.update({chain.source_key, fx.source_key})
    state.job("RUNNING").hard_sources.add(fx.source_key)
    state.job("RUNNING").running_since = now - timedelta(hours=2)
    state.job("DONE").hard_sources.add(chain.source_key)
    state.job("DONE").last_completed = datetime(2026, 11, 23, 1, 0, tzinfo=timezone.utc)  # after Berlin midnight
    alerts = {a.subject: a for a in evaluate(policies, state, now)}
    assert set(alerts) == {f"job {job}" for job in [*waiting, "RUNNING"]}
    assert all(a.kind is AlertKind.JOB_OVERDUE and a.jobs == (a.subject[4:],) for a in alerts.values())
    cause = ("overdue since 06:00 Europe/Berlin (2026-11-23 05:00 UTC): waiting on sap_b4:CHAIN_X, which has had "
             "no new data since 2026-11-22 21:14 UTC")
    assert alerts["job J3"].summary == f"job J3 {cause}"
    assert "run ? running since 2026-11-23 04:30 UTC" in alerts["job RUNNING"].summary

    text = digest_text([_notice(a, AlertAction.RAISE) for a in alerts.values()])
    assert text.splitlines() == ["Heartbeat: 11 alert update(s)",
                                 f"• [ERROR] 10 jobs {cause} (jobs: {', '.join(waiting)})",
                                 f"• [ERROR] {alerts['job RUNNING'].summary}"]
    storm = [_notice(alerts[f"job {job}"], AlertAction.RAISE) for job in waiting]
    assert digest_text(storm) == f"[ERROR] 10 jobs {cause} (jobs: {', '.join(waiting)})"

    chain.last_new_data = now + timedelta(minutes=1)              # the chain turns green; no run completed yet
    later = {a.subject: a for a in evaluate(policies, state, now + timedelta(minutes=5))}
    assert {s: a.key for s, a in later.items()} == {s: a.key for s, a in alerts.items()}  # the same alerts
    assert later["job J3"].summary == ("job J3 overdue since 06:00 Europe/Berlin (2026-11-23 05:00 UTC): every "
                                       "hard source has new data since 2026-11-22 23:00 UTC, yet no run completed")


def test_a_deadline_missed_while_a_trigger_hold_keeps_the_job_back_names_the_hold():
    """A job whose data is all there but whose run a trigger hold keeps back (issue 57): its overdue alert, and
    `explain`'s deadline line, name the hold as the root cause; once no hold keeps it back the words say so."""
    from heartbeat_runner.policies.alerts import HotState, alert_policies, evaluate
    from heartbeat_runner.runner.alerting import AlertMonitor, deadlines_since, overdue_now
    from heartbeat_runner.runner.tick_result import JobProblem, TickResult

    now = datetime(2026, 11, 23, 6, 30, tzinfo=timezone.utc)
    policies = alert_policies({"alerts": {"default": {"job": {"deadline": "06:00"}}}})
    hold = "held by min_interval until 2026-11-23T07:00:00+00:00: previous run started 2026-11-23T06:00:00+00:00"
    monitor = AlertMonitor.__new__(AlertMonitor)  # only its hot state and fold: no store is read here
    monitor.state, monitor._erring, monitor._held = HotState(), set(), set()
    monitor.state.source("delta_table:orders").last_new_data = now - timedelta(minutes=10)
    monitor.state.job("J1").hard_sources.add("delta_table:orders")

    monitor.fold(TickResult("tick-1", now, held=[JobProblem("J1", hold)]))
    (alert,) = evaluate(policies, monitor.state, now)
    assert alert.summary == ("job J1 overdue since 06:00 UTC (2026-11-23 06:00 UTC): every hard source has new data "
                             f"since 2026-11-23 00:00 UTC, but the job is {hold}")
    monitor.fold(TickResult("tick-2", now))                      # the next tick holds it no more
    (alert,) = evaluate(policies, monitor.state, now)
    assert alert.summary.endswith("yet no run completed")

    # `explain` reads the same from the control table, at this machine's time: a deadline an hour ago
    due = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%H:%M")
    explain_policies = alert_policies({"alerts": {"default": {"job": {"deadline": due}}}})
    rows = [{"source_key": "delta_table:orders", "trigger_job_id": "J1", "dependency_flag": "TRUE",
             "status": "NEW_EVENT_AVAILABLE", "latest_event_fetched_timestamp": datetime.now(timezone.utc),
             "row_created_timestamp": datetime(2026, 1, 1, tzinfo=timezone.utc)}]
    seen = deadlines_since(explain_policies, ["J1"], {}, datetime(2026, 1, 1, tzinfo=timezone.utc))  # long seen
    explained = overdue_now(explain_policies, rows, "J1", seen, held=hold)
    assert explained is not None and explained.reason.endswith(f"but the job is {hold}"), explained
    assert overdue_now(explain_policies, rows, "J1", seen).reason.endswith("yet no run completed")


def test_email_goes_over_starttls_with_a_message_id_from_the_alert_key(tmp_path):
    with MailReceiver(tmp_path) as mail:
        destination = Destination("mail", DestinationKind.EMAIL, host="127.0.0.1", port=mail.port,
                                  sender="hb@example.com", to=("data@example.com",), ca_file=str(mail.cert))
        notice = Notice("k" * 32, AlertAction.RAISE, "JOB_FAILED", "job 1", "job 1: run 7 failed: boom", "error",
                        "2026-11-23T05:00:00+00:00")
        send(destination, [notice])
        send(destination, [replace(notice, action=AlertAction.RESOLVE)])
        first, second = mail.wait(2)
        cause = "overdue since 06:00 UTC (2026-11-23 06:00 UTC): waiting on trigger_file:drop, which has had no " \
                "new data since never"
        storm = [Notice(f"{i}" * 32, AlertAction.RAISE, "JOB_OVERDUE", f"job J{i}", f"job J{i} {cause}", "error",
                        "2026-11-23T06:00:00+00:00", jobs=(f"J{i}",), cause=cause) for i in range(1, 4)]
        send(destination, storm)
        (third,) = mail.wait(3)[2:]
    assert mail.tls_sessions == 3
    assert first["Message-ID"] == message_id([notice]) == f"<{'k' * 32}.raise@heartbeat>"
    assert second["In-Reply-To"] == first["Message-ID"]          # the resolve threads under the raise
    assert "job 1: run 7 failed: boom" in first["Subject"]
    subject = str(third["Subject"]).replace("\r", "").replace("\n", "")  # unfolded
    assert subject == f"[heartbeat] [ERROR] 3 jobs {cause} (jobs: J1, J2, J3)"[:200]  # the cause, once
    assert mail_keys(third) == [n.key for n in storm]


# -- conditions through real ticks ------------------------------------------------------------------

def test_each_condition_raises_one_alert_and_one_resolve(hb, receiver, tmp_path):
    """Run failed (with its link), trigger error, sensing error, a run too long and a late source: each
    reaches the webhook, PagerDuty and email once when it begins and once when it clears, with one key."""
    with JobsApiServer() as api, MailReceiver(tmp_path) as mail:
        job, quiet = str(api.add_job()), str(api.add_job())
        hb.app.settings = hb.settings.with_(run_policy_file=policy_file(tmp_path, receiver, (
            "  default:\n    job: {failed: true, trigger_error_after: 1s}\n    source: {sensing_error_after: 1s}\n"
            f"  jobs:\n    '{job}': {{run_longer_than: 3s}}\n"
            "  sources:\n    'delta_table:sales.quiet': {new_data_every: 2s}\n"), mail=mail))
        hb.create_table("sales.orders", "id int")
        hb.create_table("sales.quiet", "id int")
        hb.seed(row("delta_table", "sales.orders", job), row("delta_table", "sales.quiet", quiet),
                row("delta_table", "sales.missing", "404"))
        heartbeat = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client(http_timeout_s=2, retry_timeout_s=2)))
        monitor = heartbeat.observer
        began = time.monotonic()
        heartbeat.tick()                                            # baseline; sales.missing fails to sense
        hb.insert("sales.orders", "(1)")
        triggered = time.monotonic()
        heartbeat.tick()                                            # job triggered
        time.sleep(max(0.0, 3.2 - (time.monotonic() - triggered), 2.2 - (time.monotonic() - began)))
        heartbeat.tick()                                            # run too long, sensing error, quiet late
        hb.create_table("sales.missing", "id int")
        hb.insert("sales.quiet", "(1)")
        api.finish_run(api.runs_of(int(job))[-1].run_id, "FAILED", "boom")
        heartbeat.tick()                                            # all three clear; the run failed
        monitor.policies = replace(monitor.policies, sources={}, jobs={})  # no freshness rule, no run limit
        for _ in range(2):
            settle(monitor)
            heartbeat.tick()                                        # records the deliveries
        version = hb.app.store.events_version()
        heartbeat.tick()
        assert hb.app.store.events_version() == version             # nothing to alert: nothing written
        api.create_manual_run(int(job), "SUCCESS")
        heartbeat.tick()                                            # a success unblocks it: failure resolved
        api.inject("run-now", UNAUTHENTICATED, times=2)
        hb.insert("sales.orders", "(2)")
        heartbeat.tick()                                            # refused
        time.sleep(1.1)
        heartbeat.tick()                                            # refused for over 1s: raised
        heartbeat.tick()                                            # triggered: resolved
        heartbeat.close()

        found = notices(receiver)
        assert by_kind(found) == {kind: Counter({"raise": 1, "resolve": 1}) for kind in
                                  ("RUN_TOO_LONG", "SENSING_ERROR", "SOURCE_LATE", "JOB_FAILED", "TRIGGER_ERROR")}
        keys = {n["kind"]: n["key"] for n in found}
        assert all(sum(1 for n in found if n["key"] == key) == 2 for key in keys.values())  # raise + resolve, one key
        failed = next(n for n in found if n["kind"] == "JOB_FAILED" and n["action"] == "raise")
        assert "boom" in failed["summary"] and failed["link"].endswith(f"/jobs/{job}/runs/"
                                                                        f"{api.runs_of(int(job))[0].run_id}")
        pager = receiver.pagerduty()
        assert Counter((p["dedup_key"], p["event_action"]) for p in pager) == Counter(
            {(key, action): 1 for key in keys.values() for action in ("trigger", "resolve")})
        assert {p["routing_key"] for p in pager} == {PD_KEY}
        mailed = Counter(key for m in mail.messages for key in mail_keys(m))
        assert mailed == Counter({key: 2 for key in keys.values()})  # one raise, one resolve (maybe in a digest)
        single = [m for m in mail.messages if len(mail_keys(m)) == 1]
        assert all(m["Message-ID"].startswith(f"<{mail_keys(m)[0]}.") for m in single)
        view = {r["kind"]: r for r in hb.app.store.read("heartbeat_alerts")}
        assert set(view) == set(keys) and not any(r["is_open"] for r in view.values())
        assert view["JOB_FAILED"]["raise_delivered_to"] == "hook,mail,pager"


def test_a_receiver_that_is_down_or_hangs_gets_the_alert_once_it_is_back(hb, receiver, tmp_path):
    """Refused (500) and hanging deliveries are retried with back-off and recorded; the tick never waits for
    them; once the receiver answers, each destination has the alert exactly once."""
    hb.app.settings = hb.settings.with_(run_policy_file=policy_file(
        tmp_path, receiver, "  default:\n    source: {sensing_error_after: 0.1s}\n"))
    hb.seed(row("delta_table", "sales.missing", "7"))
    monitor = hb.heartbeat.observer
    monitor.outbox.backoff = Backoff(first_s=0.2, max_s=300.0)
    receiver.mode = "error"
    hb.tick()                                                       # failing since now
    hb.tick()                                                       # raised; the first send is refused
    deadline = time.monotonic() + 20
    while receiver.refused < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    receiver.mode = "hang"
    time.sleep(0.5)                                                 # the retry is now held by the receiver
    hb.tick()                                                       # records the refusals
    assert receiver.in_flight >= 1                                  # the tick ended while a send was hanging
    receiver.mode = "ok"
    settle(monitor)
    hb.tick()
    assert [n["kind"] for n in notices(receiver)] == ["SENSING_ERROR"]
    assert len(receiver.pagerduty()) == 1
    (alert,) = hb.app.store.read("heartbeat_alerts")
    assert alert["is_open"] and alert["raise_delivered_to"] == "hook,pager"
    assert alert["failed_deliveries"] >= 2 and "HTTP 500" in alert["last_delivery_error"]


@pytest.mark.slow
def test_late_source_for_50_jobs_is_one_message_delivered_across_kills_and_watched_by_check(tmp_path, receiver):
    """A real runner: 50 jobs past their deadline because their one hard source has no data are 50 alerts (one
    per job) in ONE webhook message that leads with the source and lists the 50; SIGKILL after the send but
    before it is recorded: sent again once, same keys; a crash after recording the resolves and before sending
    them: sent once by the next run, again as one message; `explain` and `alerts` show them; `check` says
    "runner not ticking" once the killed runner's limit has passed."""
    from harness import HEADER, CliLakehouse, marker_jobs_file

    jobs = [f"J{i:02d}" for i in range(1, 51)]
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, *(row("trigger_file", "drop", job) for job in jobs)]) + "\n")
    policy = tmp_path / "run_policies.yml"
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", *jobs),
                        env={"HEARTBEAT_RUN_POLICY": str(policy), HOOK_ENV: f"{receiver.url}/hook",
                             PD_ENV: PD_KEY})
    lake.home.mkdir()
    lake.cli("seed")
    due = deadline_in(30)
    policy_file(tmp_path, receiver, f"  runner: {{not_ticking_after: 8s}}\n"
                f"  default:\n    job: {{deadline: '{due:%H:%M:%S} UTC'}}\n", group="1h")
    lake.cli("run")                                                 # a runner sees the deadline before it passes
    assert not lake.events("ALERT_RAISED")
    wait_past(due)
    runner = lake.start("run", "--loop", "--interval", "120")
    try:
        found = receiver.wait(1, timeout=90)
    finally:
        runner.send_signal(signal.SIGKILL)                           # before the next tick records the send
        runner.wait(30)
    assert len(found) == 1, runner.stderr.read()
    first = found[0]
    assert [(n["kind"], n["jobs"], n["subject"]) for n in first["alerts"]] == [
        ("JOB_OVERDUE", [job], f"job {job}") for job in jobs]
    keys = [n["key"] for n in first["alerts"]]
    assert len(set(keys)) == 50
    assert first["text"].startswith(f"[ERROR] 50 jobs overdue since {due:%H:%M} UTC ({due:%Y-%m-%d %H:%M} UTC): "
                                    "waiting on trigger_file:drop, which has had no new data since never (jobs: "
                                    f"{', '.join(jobs)})")
    assert len(lake.events("ALERT_RAISED")) == 50 and not lake.events("ALERT_SENT")

    ticked = json.loads((lake.home / "locks" / "heartbeat.alive").read_text())["ticked_at"]
    time.sleep(max(0.0, ticked + 8.5 - time.time()))
    watched = lake.cli("check", check=False)
    assert watched.returncode == 2 and "runner not ticking" in watched.stdout
    lake.cli("check", check=False)                                  # still down: not raised again

    (down,) = [a for a in json.loads(lake.cli("alerts", "--json").stdout) if a["kind"] == "RUNNER_NOT_TICKING"]
    assert down["is_open"] and down["raise_delivered_to"] == "hook,pager"      # listed while nobody ticks
    lake.cli("run")                                                 # re-sends what was not recorded as sent
    assert lake.cli("check").returncode == 0                        # ticking again: resolved
    hooks = [n for body in receiver.hooks() for n in body["alerts"]]
    assert [(n["kind"], n["action"]) for n in hooks] == [("JOB_OVERDUE", "raise")] * 50 + [
        ("RUNNER_NOT_TICKING", "raise")] + [("JOB_OVERDUE", "raise")] * 50 + [("RUNNER_NOT_TICKING", "resolve")]
    assert [n["key"] for n in hooks[51:101]] == keys                 # delivered twice at most, same keys
    # PagerDuty: one event per alert; its send may or may not have happened before the kill: once or twice each
    triggers = Counter(p["dedup_key"] for p in receiver.pagerduty() if p["event_action"] == "trigger")
    assert set(keys) <= set(triggers) and all(triggers[key] in (1, 2) for key in keys)
    explained = lake.cli("explain", "--job-id", "J07").stdout
    assert "deadline: overdue since" in explained and "waiting on trigger_file:drop" in explained
    listed = json.loads(lake.cli("alerts", "--json").stdout)
    assert sorted(a["alert_key"] for a in listed) == sorted(keys)
    assert {a["raise_delivered_to"] for a in listed} == {"hook,pager"}

    policy_file(tmp_path, receiver, "  runner: {not_ticking_after: 8s}\n", group="1h")  # the deadline is gone
    crashed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": "after_alert_recorded"})
    resolved = Counter(json.loads(e["payload"])["kind"] for e in lake.events("ALERT_RESOLVED"))
    assert crashed.returncode == 86 and resolved == Counter({"JOB_OVERDUE": 50, "RUNNER_NOT_TICKING": 1}), resolved
    lake.cli("run")
    bodies = receiver.hooks()
    sent = [n for body in bodies for n in body["alerts"]]
    assert sorted((n["kind"], n["action"], n["key"]) for n in sent[102:]) == sorted(
        ("JOB_OVERDUE", "resolve", key) for key in keys)
    assert len(sent) == 152                                           # the raises were not sent a third time
    assert bodies[-1]["text"].startswith("[RESOLVED] 50 jobs overdue since")  # one message for the 50 resolves


def test_check_allows_three_of_the_runners_intervals_plus_a_minute(tmp_path):
    from heartbeat_runner.policies.alerts import AlertPolicies
    from heartbeat_runner.runner.alerting import liveness_path, runner_liveness

    assert not runner_liveness(tmp_path, AlertPolicies()).healthy            # never ticked
    path = liveness_path(tmp_path)
    path.parent.mkdir(parents=True)
    now = time.time()
    path.write_text(json.dumps({"ticked_at": now - 100, "interval_s": 10}))
    found = runner_liveness(tmp_path, AlertPolicies(), now)
    assert not found.healthy and found.limit_s == 90 and "the last tick ended 100 s ago" in found.message
    path.write_text(json.dumps({"ticked_at": now - 100, "interval_s": 300}))  # cron every 5 minutes
    assert runner_liveness(tmp_path, AlertPolicies(), now).healthy
    assert not runner_liveness(tmp_path, AlertPolicies(not_ticking_after=timedelta(seconds=60)), now).healthy


def test_a_webhook_url_from_a_databricks_secret_scope_delivers_and_is_never_shown(hb, tmp_path, monkeypatch, caplog,
                                                                                 capsys):
    """``url: {secret: scope/key}``: the runner reads the webhook URL through the workspace's secrets API (the
    stand-in over HTTP, the SDK's auth chain) at send time and delivers; a destination whose key is missing
    fails with the destination, setting, scope and key named. The URL is in no table, log or output."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.delenv("DATABRICKS_CONFIG_PROFILE", raising=False)
    with AlertReceiver() as receiver, JobsApiServer() as workspace:
        canary = "canary-7c1e94d2"
        workspace.workspace.put_secret("heartbeat", "alert-hook", f"{receiver.url}/hook/{canary}")
        monkeypatch.setenv("DATABRICKS_HOST", workspace.host)
        monkeypatch.setenv("DATABRICKS_TOKEN", TOKEN)
        path = tmp_path / "run_policies.yml"
        path.write_text("alerts:\n  group_interval: off\n  default:\n    source: {sensing_error_after: 0.1s}\n"
                        "  destinations:\n    hook: {type: webhook, url: {secret: heartbeat/alert-hook}}\n"
                        "    lost: {type: webhook, url: {secret: heartbeat/no-such-key}}\n")
        hb.app.settings = hb.settings.with_(run_policy_file=path)
        hb.seed(row("delta_table", "sales.missing", "7"))
        hb.tick()                                                   # failing since now
        hb.tick()                                                   # raised: sent
        deadline = time.monotonic() + 20
        while not receiver.received and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        hb.tick()                                                   # records what the sends came to
        (delivered,) = receiver.received
        assert delivered.path == f"/hook/{canary}"
        assert [n["kind"] for n in delivered.body["alerts"]] == ["SENSING_ERROR"]
        assert workspace.workspace.reads["heartbeat/alert-hook"] == 1
    (alert,) = hb.app.store.read("heartbeat_alerts")
    assert alert["raise_delivered_to"] == "hook"
    assert alert["last_delivery_error"].startswith(
        "webhook destination lost: alerts.destinations.lost.url: {secret: heartbeat/no-such-key}: "
        "secret scope 'heartbeat' has no key 'no-such-key'")
    stored = json.dumps([hb.app.store.read(t) for t in ("heartbeat_events", "heartbeat_alerts")], default=str)
    shown = capsys.readouterr()
    for text in (stored, caplog.text, shown.out, shown.err):
        assert canary not in text


# -- destinations: checked before any tick, and no secret anywhere ------------------------------------

CANARY = "C4nary7Qx9"
#: a routing key of the right shape that carries the canary
CANARY_KEY = (CANARY + "0" * 32)[:32]


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_validate_names_every_destination_it_could_not_send_to(tmp_path, monkeypatch):
    """A URL that is not http(s) with a host (in the file, or in the webhook's variable), an unset variable, a
    malformed e-mail address or routing key: each named by its field, none quoting the secret it read."""
    from heartbeat_runner.policies.run_policies import alert_destination_problems

    path = tmp_path / "p.yml"
    path.write_text("alerts:\n  destinations:\n"
                    "    chat: {type: webhook, url_env: HB_T_CHAT}\n"
                    "    unset: {type: webhook, url_env: HB_T_UNSET}\n"
                    f"    pasted: {{type: webhook, url_env: 'https://hooks.example.com/{CANARY}'}}\n"
                    "    pager: {type: pagerduty, routing_key_env: HB_T_KEY, url: 'htp//events.example.com/v2'}\n"
                    "    mail: {type: email, host: smtp.example.com, from: 'heartbeat at example', to: [ok@example.com,"
                    " 'not an address'], username_env: HB_T_USER}\n")
    with pytest.raises(ConfigError) as caught:
        load_run_policies(path)
    text = str(caught.value)
    for field in ("alerts.destinations.pasted.url_env: must be the name of an environment variable",
                  "alerts.destinations.pager.url: not an http or https URL with a host",
                  "alerts.destinations.mail.from: 'heartbeat at example' is not an e-mail address",
                  "alerts.destinations.mail.to: 'not an address' is not an e-mail address",
                  "alerts.destinations.mail: username and password go together"):
        assert field in text
    assert str(path) in text and CANARY not in text

    path.write_text("alerts:\n  destinations:\n"
                    "    chat: {type: webhook, url_env: HB_T_CHAT}\n"
                    "    unset: {type: webhook, url_env: HB_T_UNSET}\n"
                    "    pager: {type: pagerduty, routing_key_env: HB_T_KEY}\n")
    monkeypatch.setenv("HB_T_CHAT", f"hooks.example.com/services/{CANARY}?token={CANARY}")  # no scheme
    monkeypatch.setenv("HB_T_KEY", f"key-{CANARY}")
    monkeypatch.delenv("HB_T_UNSET", raising=False)
    problems = alert_destination_problems(path, load_run_policies(path).alerts)
    assert problems == [f"{path}: invalid alerts policy: {p}" for p in (
        "alerts.destinations.chat.url: environment variable HB_T_CHAT does not hold an http or https URL with a "
        "host (its value is a secret and not shown)",
        "alerts.destinations.unset.url: environment variable HB_T_UNSET is not set",
        "alerts.destinations.pager.routing_key: environment variable HB_T_KEY does not hold a PagerDuty routing "
        "key of 32 letters and digits (its value is a secret and not shown)")]
    monkeypatch.setenv("HB_T_CHAT", "https://hooks.example.com/services/T/B/x")
    monkeypatch.setenv("HB_T_UNSET", "http://127.0.0.1:8080/hook")
    monkeypatch.setenv("HB_T_KEY", CANARY_KEY)
    assert alert_destination_problems(path, load_run_policies(path).alerts) == []


@pytest.mark.parametrize("url", [f"127.0.0.1:9/hook/{CANARY}?token={CANARY}",            # no scheme
                                 f"htp//127.0.0.1/hook/{CANARY}?token={CANARY}",
                                 f"http://127.0.0.1:{{port}}/hook/{CANARY} x?token={CANARY}",  # a space in the path
                                 f"http://127.0.0.1:{{port}}/hook/{CANARY}?token={CANARY}"])  # nobody listening
def test_a_failed_delivery_is_one_line_naming_the_destination_without_its_url(url, monkeypatch):
    """Even a URL no check caught: the error is a DeliveryError of one line, naming the destination by its key,
    with no path, query or token of the URL (the cause is kept)."""
    from heartbeat_runner.senders.send import DeliveryError

    monkeypatch.setenv("HB_T_HOOK", url.format(port=closed_port()))
    notice = Notice("k" * 32, AlertAction.RAISE, "JOB_FAILED", "job 1", "job 1 failed", "error", "2026-11-23")
    with pytest.raises(DeliveryError) as caught:
        send(Destination("team_chat", DestinationKind.WEBHOOK, url_secret=SecretRef(SecretKind.ENV, "HB_T_HOOK")),
             [notice], timeout_s=2)
    text = str(caught.value)
    assert text.startswith("webhook destination team_chat: ") and "\n" not in text
    assert CANARY not in text and "/hook" not in text and caught.value.__cause__ is not None


def test_every_spelling_of_a_secret_reference_is_checked_without_quoting_it(tmp_path, monkeypatch):
    """``url: {env: NAME}`` is checked as ``url_env: NAME`` is (a variable's name, set, holding a URL with a
    host); ``{secret: ...}`` must be ``scope/key`` as written (its value is only read at send time); SMTP
    username and password go together whichever way each is written. No problem quotes what was written."""
    from heartbeat_runner.policies.run_policies import alert_destination_problems

    path = tmp_path / "p.yml"
    path.write_text("alerts:\n  destinations:\n"
                    f"    pasted_env: {{type: webhook, url: {{env: 'https://hooks.example.com/{CANARY}'}}}}\n"
                    f"    pasted_secret: {{type: webhook, url: {{secret: 'https://hooks.example.com/{CANARY}'}}}}\n"
                    f"    pasted_key: {{type: pagerduty, routing_key: {{secret: 'pd/{CANARY} x'}}}}\n"
                    "    mail: {type: email, host: smtp.example.com, from: hb@example.com, to: ok@example.com, "
                    "username: {secret: mail/user}}\n")
    with pytest.raises(ConfigError) as caught:
        load_run_policies(path)
    text = str(caught.value)
    for problem in ("alerts.destinations.pasted_env.url: must be the name of an environment variable",
                    "alerts.destinations.pasted_secret.url: {secret: ...} must name a scope and a key",
                    "alerts.destinations.pasted_key.routing_key: {secret: ...} must name a scope and a key",
                    "alerts.destinations.mail: username and password go together"):
        assert problem in text
    assert CANARY not in text and "hooks.example.com" not in text

    path.write_text("alerts:\n  destinations:\n"
                    "    chat: {type: webhook, url: {env: HB_T_CHAT}}\n"
                    "    scoped: {type: webhook, url: {secret: heartbeat/hook}}\n"
                    "    pager: {type: pagerduty, routing_key: {secret: heartbeat/pd-key}}\n"
                    "    mail: {type: email, host: smtp.example.com, from: hb@example.com, to: ok@example.com, "
                    "username: {secret: mail/user}, password: {env: HB_T_PASSWORD}}\n")
    monkeypatch.setenv("HB_T_CHAT", f"hooks.example.com/{CANARY}")
    monkeypatch.delenv("HB_T_PASSWORD", raising=False)
    problems = alert_destination_problems(path, load_run_policies(path).alerts)  # no secret scope is read
    assert problems == [f"{path}: invalid alerts policy: {p}" for p in (
        "alerts.destinations.chat.url: environment variable HB_T_CHAT does not hold an http or https URL with a "
        "host (its value is a secret and not shown)",
        "alerts.destinations.mail.password: environment variable HB_T_PASSWORD is not set")]


class ScopeSecrets:
    """A secret resolver over a dict of ``scope/key`` -> value, counting reads."""

    def __init__(self, values: dict[str, str]):
        self.values, self.reads = values, Counter()

    def secret(self, scope: str, key: str) -> str:
        from heartbeat_runner.core.secrets import SecretNotFoundError

        self.reads[f"{scope}/{key}"] += 1
        if f"{scope}/{key}" not in self.values:
            raise SecretNotFoundError(f"secret scope {scope!r} has no key {key!r}")
        return self.values[f"{scope}/{key}"]


def test_a_value_from_a_secret_scope_is_checked_at_send_time_and_redacted(monkeypatch):
    """A ``{secret: scope/key}`` value of the wrong shape (a URL without scheme, a malformed routing key) fails
    at send time as one line naming the destination and ``scope/key``; a failure whose text quotes the values
    read from the scope (or the environment) has them redacted; ``secrets_of`` covers resolved values."""
    from heartbeat_runner.senders import send as sender
    from heartbeat_runner.senders.send import DeliveryError, secrets_of

    notice = Notice("k" * 32, AlertAction.RAISE, "JOB_FAILED", "job 1", "job 1 failed", "error", "2026-11-23")
    scope = ScopeSecrets({"hb/hook": f"hooks.example.com/{CANARY}", "hb/pd": f"key-{CANARY}",
                          "hb/user": f"user-{CANARY}", "hb/good-hook": f"https://hooks.example.com/{CANARY}/x"})
    hook = Destination("team_chat", DestinationKind.WEBHOOK, url_secret=SecretRef(SecretKind.SECRET, "hb/hook"))
    pager = Destination("oncall", DestinationKind.PAGERDUTY, url="http://127.0.0.1:9/v2/enqueue",
                        routing_key_secret=SecretRef(SecretKind.SECRET, "hb/pd"))
    for destination, setting, ref, shape in ((hook, "url", "hb/hook", "does not hold an http or https URL"),
                                             (pager, "routing_key", "hb/pd", "does not hold a PagerDuty routing key")):
        with pytest.raises(DeliveryError) as caught:
            send(destination, [notice], timeout_s=2, secrets=scope)
        text = str(caught.value)
        assert text.startswith(f"{destination.kind.value} destination {destination.name}: "
                               f"alerts.destinations.{destination.name}.{setting}: {{secret: {ref}}} {shape}")
        assert CANARY not in text and "\n" not in text
    lost = replace(hook, url_secret=SecretRef(SecretKind.SECRET, "hb/no-such-key"))
    with pytest.raises(DeliveryError) as caught:
        send(lost, [notice], timeout_s=2, secrets=scope)
    assert "webhook destination team_chat: alerts.destinations.team_chat.url: {secret: hb/no-such-key}" in str(
        caught.value)

    monkeypatch.setenv("HB_T_PASSWORD", f"pw-{CANARY}")
    mail = Destination("mail", DestinationKind.EMAIL, host="127.0.0.1", port=closed_port(), sender="hb@example.com",
                       to=("data@example.com",), username_secret=SecretRef(SecretKind.SECRET, "hb/user"),
                       password_secret=SecretRef(SecretKind.ENV, "HB_T_PASSWORD"))
    chat = replace(hook, url_secret=SecretRef(SecretKind.SECRET, "hb/good-hook"))

    def quoting(destination, notices, timeout_s, secrets):  # a library that quotes what it was given
        read = [sender._secret(getattr(destination, f"{s}_secret"), destination, s, secrets)
                for s in ("url", "username", "password") if getattr(destination, f"{s}_secret") is not None]
        raise RuntimeError("refused " + " and ".join(f"'{v}'" for v in read))

    for destination in (mail, chat):
        monkeypatch.setitem(sender.SENDERS, destination.kind, quoting)
        with pytest.raises(DeliveryError) as caught:
            send(destination, [notice], timeout_s=2, secrets=scope)
        text = str(caught.value)
        assert text.startswith(f"{destination.kind.value} destination {destination.name}: RuntimeError: refused ")
        assert CANARY not in text and "***" in text
    assert f"user-{CANARY}" in secrets_of(mail, {"hb/user": f"user-{CANARY}"})
    assert f"pw-{CANARY}" in secrets_of(mail) and f"user-{CANARY}" not in secrets_of(mail)  # a scope: never read


def canary_hits(home: Path, outputs: list[str]) -> list[str]:
    """Where the canary is: every file under the lakehouse folder (raw bytes), every Delta table there
    (decoded: a compressed Parquet column would hide it from a byte search) and every command output."""
    from deltalake import DeltaTable

    hits = [f"output {i}" for i, text in enumerate(outputs) if CANARY in text]
    hits += [str(p) for p in home.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    tables = {p.parent for p in home.rglob("_delta_log")}
    assert any(t.name == "heartbeat_events" for t in tables)
    for table in tables:
        rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
        hits += [f"table {table.name}" for _ in range(1) if CANARY in json.dumps(rows, default=str)]
    return hits


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_no_secret_reaches_a_file_a_table_or_an_output(tmp_path):
    """Every destination kind, sent to and failing (refused, unreachable, SMTP login refused), with a canary in
    every secret (webhook URL path and query, routing key, SMTP user and password): `validate` and `run` refuse a
    webhook URL without a scheme before any tick, naming the field; then alerts go out and fail, each failure
    recorded as one line naming the destination; the canary is in no file, table or output."""
    from harness import HEADER, CliLakehouse, marker_jobs_file

    with AlertReceiver() as up, AlertReceiver(mode="error") as down, MailReceiver(tmp_path) as mail:
        config = tmp_path / "config.csv"
        config.write_text("\n".join([HEADER, row("delta_table", "sales.missing", "404")]) + "\n")
        policy = tmp_path / "run_policies.yml"
        policy.write_text(
            "alerts:\n  group_interval: off\n  default:\n    source: {sensing_error_after: 0.1s}\n  destinations:\n"
            "    hook: {type: webhook, url_env: HB_C_HOOK}\n"
            f"    pager: {{type: pagerduty, routing_key_env: HB_C_KEY, url: '{up.url}/v2/enqueue'}}\n"
            "    down_hook: {type: webhook, url_env: HB_C_DOWN_HOOK}\n"
            f"    down_pager: {{type: pagerduty, routing_key_env: HB_C_KEY, url: '{down.url}/v2/enqueue'}}\n"
            "    gone_hook: {type: webhook, url_env: HB_C_GONE_HOOK}\n"
            f"    mail: {{type: email, host: 127.0.0.1, port: {mail.port}, from: hb@example.com, to: [data@example.com],"
            f" ca_file: '{mail.cert}', username_env: HB_C_USER, password_env: HB_C_PASSWORD}}\n")
        secret_path = f"/hook/{CANARY}?token={CANARY}"
        env = {"HEARTBEAT_RUN_POLICY": str(policy), "HB_C_HOOK": f"{up.url}{secret_path}", "HB_C_KEY": CANARY_KEY,
               "HB_C_DOWN_HOOK": f"{down.url}{secret_path}",
               "HB_C_GONE_HOOK": f"http://127.0.0.1:{closed_port()}{secret_path}",
               "HB_C_USER": f"user-{CANARY}", "HB_C_PASSWORD": f"pw-{CANARY}"}
        lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(
            tmp_path / "jobs.yml", "404"), env=env)
        lake.home.mkdir()
        outputs: list[str] = []

        def cli(*args: str, code: int | None = 0, **more: str) -> str:
            proc = lake.cli(*args, check=False, env=more)
            text = proc.stdout + proc.stderr
            outputs.append(text)
            assert code is None or proc.returncode == code, (args, text)
            assert "Traceback" not in text, (args, text)
            return text

        cli("seed")
        bad = {"HB_C_HOOK": f"{up.url.removeprefix('http://')}{secret_path}"}  # pasted without its scheme
        for command in ("validate", "run"):
            said = cli(command, code=1, **bad)
            assert "alerts.destinations.hook.url: environment variable HB_C_HOOK does not hold an http or " \
                   "https URL with a host" in said
        assert not lake.events("ALERT_RAISED") and not [e for e in lake.events() if e["event_type"] == "SENSED"]
        assert "valid" in cli("validate")
        cli("run", code=None)                                       # sales.missing fails sensing from now
        cli("run", "--verbose", code=None)                          # raised; sent (and refused) on the way out
        hooked = [r for r in up.received if r.path == secret_path]
        assert [n["kind"] for r in hooked for n in r.body["alerts"]] == ["SENSING_ERROR"]  # the secrets did work
        assert [p["routing_key"] for p in up.pagerduty()] == [CANARY_KEY]
        lake.append_ids("sales.missing", 1)
        cli("run", "--verbose", code=None)                          # resolved
        for args in (("alerts", "--all"), ("alerts", "--all", "--json"), ("status",), ("status", "--json"),
                     ("explain", "--job-id", "404"), ("explain", "--job-id", "404", "--json"), ("runs",),
                     ("runs", "--json"), ("check",)):
            cli(*args, code=None)

        failed = lake.events("ALERT_DELIVERY_FAILED")
        assert {json.loads(e["payload"])["destination"] for e in failed} == {"down_hook", "down_pager", "gone_hook",
                                                                             "mail"}
        for event in failed:
            destination = json.loads(event["payload"])["destination"]
            assert f" destination {destination}: " in event["message"] and "\n" not in event["message"]
        assert canary_hits(lake.home, outputs) == []


# -- deadlines through real ticks -----------------------------------------------------------------------

def deadline_in(seconds: float) -> datetime:
    """A deadline ``seconds`` from now, to the second (never across midnight UTC: the day would change)."""
    now = datetime.now(timezone.utc)
    if (now + timedelta(seconds=seconds + 5)).date() != now.date():
        time.sleep((datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), timezone.utc) - now)
                   .total_seconds() + 1)
        now = datetime.now(timezone.utc)
    return (now + timedelta(seconds=seconds)).replace(microsecond=0)


def wait_past(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(timezone.utc)).total_seconds() + 0.5))


def overdue_events(hb, kind: str) -> list[dict]:
    return [e for e in hb.events(kind) if json.loads(e["payload"])["kind"] == "JOB_OVERDUE"]


def test_a_deadline_is_first_checked_at_its_first_occurrence_after_it_was_configured(hb, receiver, tmp_path):
    """A job configured a few seconds before its deadline is not "overdue since yesterday" at the first tick
    (the deadline did not exist yesterday); once today's deadline passes, it is overdue since today's."""
    hb.jobs(J1=0)
    hb.create_table("sales.a", "id int")
    hb.seed(row("delta_table", "sales.a", "J1"))
    due = deadline_in(8)  # the first tick ends before the deadline, even on a busy machine
    hb.app.settings = hb.settings.with_(run_policy_file=policy_file(
        tmp_path, receiver, f"  jobs:\n    'J1': {{deadline: '{due:%H:%M:%S} UTC'}}\n"))
    hb.tick()
    assert not overdue_events(hb, "ALERT_RAISED")                  # yesterday's deadline predates it
    wait_past(due)
    hb.tick()
    (raised,) = overdue_events(hb, "ALERT_RAISED")
    assert f"job J1 overdue since {due:%H:%M} UTC ({due:%Y-%m-%d %H:%M} UTC): waiting on delta_table:sales.a" in \
        raised["message"]
    assert json.loads(raised["payload"])["since"] == due.isoformat()


def alert_rows(hb) -> dict[str, dict]:
    """The heartbeat_alerts view by subject."""
    return {r["subject"]: r for r in hb.app.store.read("heartbeat_alerts")}


def test_an_overdue_alert_is_one_per_job_and_its_words_follow_the_cause(hb, receiver, tmp_path):
    """J1 and J2 wait on two late sources, J3 on a third: three alerts, one message naming J1 and J2's shared
    cause once. Data reaching one of J1's sources, then the runs starting, re-word the open alerts (recorded,
    shown by heartbeat_alerts) without sending, resolving or re-raising anything; a quiet tick writes nothing;
    each alert is resolved once, when its job has completed."""
    hb.jobs(J1=0, J2=0, J3=0)
    for table in ("sales.a", "sales.b", "sales.c"):
        hb.create_table(table, "id int")
    hb.seed(*(row("delta_table", f"sales.{t}", j) for t, j in (("a", "J1"), ("b", "J1"), ("a", "J2"), ("b", "J2"),
                                                               ("c", "J3"))))
    due = deadline_in(8)  # the first tick ends before the deadline, even on a busy machine
    hb.app.settings = hb.settings.with_(run_policy_file=policy_file(
        tmp_path, receiver, f"  default:\n    job: {{deadline: '{due:%H:%M:%S} UTC'}}\n"))
    monitor = hb.heartbeat.observer
    hb.tick()                                                       # baseline, before the deadline
    wait_past(due)
    hb.tick()                                                       # overdue: three alerts
    raised = {json.loads(e["payload"])["subject"]: json.loads(e["payload"]) for e in overdue_events(
        hb, "ALERT_RAISED")}
    assert {s: r["jobs"] for s, r in raised.items()} == {"job J1": ["J1"], "job J2": ["J2"], "job J3": ["J3"]}
    settle(monitor)
    (message,) = receiver.hooks()
    both = (f"overdue since {due:%H:%M} UTC ({due:%Y-%m-%d %H:%M} UTC): waiting on delta_table:sales.a, which has "
            "had no new data since never; waiting on delta_table:sales.b, which has had no new data since never")
    assert f"• [ERROR] 2 jobs {both} (jobs: J1, J2)" in message["text"].splitlines()
    assert raised["job J1"]["summary"] == f"job J1 {both}"

    hb.insert("sales.a", "(1)")
    hb.tick()                                                       # J1, J2 still wait on sales.b: re-worded
    assert sorted(json.loads(e["payload"])["subject"] for e in overdue_events(hb, "ALERT_UPDATED")) == [
        "job J1", "job J2"]
    view = alert_rows(hb)
    assert view["job J1"]["summary"] == (f"job J1 overdue since {due:%H:%M} UTC ({due:%Y-%m-%d %H:%M} UTC): waiting "
                                         "on delta_table:sales.b, which has had no new data since never")
    assert view["job J1"]["updated_at"] is not None and view["job J3"]["updated_at"] is None
    assert view["job J3"]["summary"] == raised["job J3"]["summary"]
    settle(monitor)
    hb.tick()                                                       # records the sends
    version = hb.app.store.events_version()
    hb.tick()
    assert hb.app.store.events_version() == version                 # no new cause, nothing to record: nothing written
    hb.insert("sales.b", "(1)")
    hb.insert("sales.c", "(1)")
    hb.tick()                                                       # the three runs start
    assert hb.job_status("J1") == hb.job_status("J3") == {"IN_PROGRESS"}
    assert all(" running since " in r["summary"] for r in alert_rows(hb).values()), alert_rows(hb)
    assert len(overdue_events(hb, "ALERT_RAISED")) == 3 and not overdue_events(hb, "ALERT_RESOLVED")
    hb.wait_for_jobs()                                              # completed: resolved
    settle(monitor)
    hb.tick()
    resolved = overdue_events(hb, "ALERT_RESOLVED")
    assert sorted(json.loads(e["payload"])["subject"] for e in resolved) == sorted(raised)
    assert by_kind(notices(receiver)) == {"JOB_OVERDUE": Counter({"raise": 3, "resolve": 3})}
    assert Counter(p["event_action"] for p in receiver.pagerduty()) == Counter({"trigger": 3, "resolve": 3})


@pytest.mark.slow  # over 13 CPU-s in CI's embedded leg: CI runs it, the everyday leg does not
def test_an_open_overdue_alert_says_the_current_cause_everywhere_without_paging_again(tmp_path, receiver):
    """A real runner, one process per tick: J1's overdue alert is raised "waiting on trigger_file:drop, which
    has had no new data since never". The file arrives, the run starts, then fails: the same alert (same key)
    now says "run … failed: ERROR: …" in `alerts --json`, `/api/alerts` and `explain`, each reading the words
    the last runner recorded (ALERT_UPDATED); nothing more was sent; a runner that finds nothing new writes no
    second update."""
    from harness import HEADER, CliLakehouse, serving_page

    failing = "import sys; print('ERROR: ledger balance mismatch'); sys.exit(1)"
    config, jobs_file = tmp_path / "config.csv", tmp_path / "jobs.yml"
    config.write_text(f"{HEADER}\n{row('trigger_file', 'drop', 'J1')}\n")
    jobs_file.write_text(f"jobs:\n  'J1': [{sys.executable!r}, '-c', {failing!r}]\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=jobs_file,
                        env={"HEARTBEAT_RUN_POLICY": str(tmp_path / "run_policies.yml"),
                             HOOK_ENV: f"{receiver.url}/hook", PD_ENV: PD_KEY})
    lake.home.mkdir()
    lake.cli("seed")
    due = deadline_in(12)
    policy_file(tmp_path, receiver, f"  default:\n    job: {{failed: false, deadline: '{due:%H:%M:%S} UTC'}}\n")
    lake.cli("run")                                                 # the deadline seen before it passes
    wait_past(due)
    lake.cli("run")                                                 # overdue: raised and sent
    (raised,) = json.loads(lake.cli("alerts", "--json").stdout)
    overdue = f"job J1 overdue since {due:%H:%M} UTC ({due:%Y-%m-%d %H:%M} UTC): "
    assert raised["subject"] == "job J1"
    assert raised["summary"] == overdue + "waiting on trigger_file:drop, which has had no new data since never"
    lake.drop_trigger_file("drop", "a.done")
    lake.cli("run")                                                 # the run starts
    (running,) = json.loads(lake.cli("alerts", "--json").stdout)
    assert running["summary"].startswith(overdue + "run ") and " running since " in running["summary"]
    lake.wait_local_runs()
    lake.cli("run", check=False)                                    # the run failed
    lake.cli("run", check=False)                                    # nothing new
    (listed,) = json.loads(lake.cli("alerts", "--json").stdout)
    assert listed["alert_key"] == raised["alert_key"] and listed["updated_at"] is not None
    assert listed["summary"].startswith(overdue + "run ") and " failed: ERROR: ledger balance mismatch" in \
        listed["summary"], listed
    assert len(lake.events("ALERT_UPDATED")) == 2                    # running, then failed: not once per runner
    reason = listed["summary"].removeprefix("job J1 ")
    assert f"deadline: {reason}" in lake.cli("explain", "--job-id", "J1").stdout
    with serving_page(lake) as base, urllib.request.urlopen(f"{base}/api/alerts", timeout=60) as answer:
        (shown,) = json.loads(answer.read())["alerts"]
    assert shown["summary"] == listed["summary"]
    assert [(n["key"], n["action"]) for n in notices(receiver)] == [(raised["alert_key"], "raise")]  # sent once
    (paged,) = receiver.pagerduty()
    assert paged["event_action"] == "trigger" and paged["payload"]["component"] == "job J1"
    assert paged["payload"]["group"] == raised["summary"].removeprefix("job J1 ")  # the cause, one per cause
