{#
  One row per run Heartbeat requested of a job (the trigger request, its retries too),
  with what the jobs API answered and how the run ended: the job page's timeline and the
  overview's "last run". Durations are the run's own (its start and end as the jobs service
  or the local job process recorded them), never the time Heartbeat took to notice the end.
  `parameters` is the JSON the job received, including the windows it consumed
  (`heartbeat_windows`). A run an operator asked for (`trigger`, the page's "Run now")
  is_manual, with its request's note (who asked, why) as manual_note. A run recorded by
  `complete` or found through the jobs API without a request of ours has no row here.
#}
{{ config(materialized='view') }}

with job_events as (
  select * from {{ heartbeat_events(all_history=true) }} e
  where e.trigger_job_id is not null
),

requests as (
  select
    trigger_job_id, idempotency_token,
    min(event_ts) as requested_at,
    max(run_id) as tick_run_id,
    max(payload) as parameters,
    max(case when event_type = 'RETRY_REQUESTED' then 1 else 0 end) = 1 as is_retry,
    {# the tick notes who asked on the TRIGGER_REQUESTED of a manual run (`trigger`, "Run now") only #}
    max(case when event_type = 'TRIGGER_REQUESTED' then message end) as manual_note
  from job_events
  where event_type in ({{ heartbeat_request_types() }})
  group by trigger_job_id, idempotency_token
),

answers as (
  select
    trigger_job_id, idempotency_token,
    max(case when event_type = 'TRIGGERED' then job_run_id end) as job_run_id,
    min(case when event_type = 'TRIGGERED' then event_ts end) as triggered_at,
    max(case when event_type = 'TRIGGER_ERROR' then message end) as trigger_error
  from job_events
  where event_type in ('TRIGGERED', 'TRIGGER_ERROR')
  group by trigger_job_id, idempotency_token
),

{# the first end event of each run id (heartbeat_run_end_types) ends it #}
endings as (
  select * from (
    select
      trigger_job_id, job_run_id, event_type as outcome, event_ts as noticed_at, message,
      {# the run's own times, as the jobs service (or the local job process) measured them #}
      cast(get_json_object(payload, '$.run_started_at') as timestamp) as run_started_at,
      cast(get_json_object(payload, '$.run_ended_at') as timestamp) as run_ended_at,
      cast(get_json_object(payload, '$.run_queued_s') as double) as queued_s,
      get_json_object(payload, '$.failure_reason') as failure_reason,
      get_json_object(payload, '$.output_tail') as output_tail,
      {# recorded by `complete` (the job's own last task, or an operator): the audit's channel; no run times #}
      get_json_object(payload, '$.via') as recorded_via,
      row_number() over (partition by trigger_job_id, job_run_id order by event_ts) as nth
    from job_events
    where event_type in ({{ heartbeat_run_end_types() }}) and job_run_id is not null
  ) ranked
  where nth = 1
)

select
  r.trigger_job_id,
  r.idempotency_token,
  r.tick_run_id,
  r.is_retry,
  r.manual_note is not null as is_manual,
  r.manual_note,
  r.requested_at,
  a.triggered_at,
  a.job_run_id,
  {# a run ended by `complete` has no times of its own: it started when the jobs API answered, and ended when
     `complete` recorded it (the control table's job_start_timestamp and job_end_timestamp) #}
  coalesce(d.run_started_at, case when d.recorded_via is not null then a.triggered_at end) as started_at,
  coalesce(d.run_ended_at, d.noticed_at) as ended_at,
  d.noticed_at,
  case
    when d.outcome is not null then d.outcome
    when a.trigger_error is not null then 'TRIGGER_ERROR'
    when a.job_run_id is not null then 'RUNNING'
    else 'REQUESTED'
  end as outcome,
  {# the run's own duration; for a run ended by `complete`, from the jobs API's answer to that record; NULL while
     it runs or where its times are unknown (never detection latency; never negative, as two clocks may disagree) #}
  coalesce(
    cast(unix_millis(d.run_ended_at) - unix_millis(d.run_started_at) as double) / 1000,
    case when d.recorded_via is not null and d.run_started_at is null and d.noticed_at >= a.triggered_at
         then cast(unix_millis(d.noticed_at) - unix_millis(a.triggered_at) as double) / 1000 end
  ) as duration_s,
  d.queued_s,
  coalesce(d.message, a.trigger_error) as message,
  case
    when d.outcome in ('FAILED', 'REFUSED') then coalesce(d.failure_reason, d.message)
    when d.outcome is null then a.trigger_error
  end as failure_reason,
  case when d.outcome = 'FAILED' then d.output_tail end as output_tail,
  r.parameters
from requests r
left join answers a on a.trigger_job_id = r.trigger_job_id and a.idempotency_token = r.idempotency_token
left join endings d on d.trigger_job_id = r.trigger_job_id and d.job_run_id = a.job_run_id
