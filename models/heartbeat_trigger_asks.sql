{#
  Manual runs waiting for the next tick: one row per job with a TRIGGER_ASKED event (from
  `trigger` or the page) newer than every lifecycle event of the job (request, completion,
  failure, reset), while it is neither running nor failed (a failed job is re-run with `retry`)
  and has no event-time window policy (such a job runs per final window). The tick requests a
  run that consumes whatever the job has pending, or nothing; once that request is recorded it
  is the newest lifecycle event and the ask is history. Asks made again before the tick
  collapse into one row: one run, whoever asked.
#}
{{ config(materialized='view') }}

with events as {{ heartbeat_events() }},

lifecycle as {{ heartbeat_lifecycle('events') }},

latest_lifecycle as (
  select trigger_job_id, max(event_ts) as lifecycle_ts
  from lifecycle
  group by trigger_job_id
),

asks as (
  select
    trigger_job_id,
    max(event_ts) as asked_ts,
    max_by(event_id, event_ts) as ask_event_id,
    max_by(payload, event_ts) as payload,
    count(*) as asks
  from events
  where event_type = 'TRIGGER_ASKED'
  group by trigger_job_id
),

blocked as (
  select distinct trigger_job_id
  from {{ ref('heartbeat_job_status') }}
  where status in ('IN_PROGRESS', {{ heartbeat_blocked_statuses() }})
)

select a.trigger_job_id, a.asked_ts, a.ask_event_id, a.payload, a.asks
from asks a
left join latest_lifecycle l on l.trigger_job_id = a.trigger_job_id
left anti join blocked b on b.trigger_job_id = a.trigger_job_id
left anti join {{ source('heartbeat', 'heartbeat_window_policies') }} w on w.trigger_job_id = a.trigger_job_id
where a.asked_ts > coalesce(l.lifecycle_ts, timestamp '1900-01-01')
