{#
  Bounded catch-up sequences (jobs/catch_up.py): one row per job whose latest trigger request
  belongs to a sequence, i.e. a backlog cut into runs of at most the job's max_window. The
  request that starts a sequence (TRIGGER_REQUESTED) records the plan; each next run is a
  NEXT_WINDOW_REQUESTED, requested by the runner in the same commit as the success of the
  run before it. `next_run_due` is true when the latest run succeeded and runs are left (a
  success recorded some other way: `complete`, or a manual run found after a failure): the
  runner requests the next run at its next tick, and the dependency rule triggers nothing
  else for the job meanwhile. A RESET ends the sequence.
#}
{{ config(materialized='view') }}

with events as {{ heartbeat_events() }},

lifecycle as {{ heartbeat_lifecycle('events') }},

sequence_requests as (
  select
    trigger_job_id, event_id, event_ts, idempotency_token,
    cast(get_json_object(payload, '$._run') as int) as run,
    cast(get_json_object(payload, '$._runs') as int) as runs,
    get_json_object(payload, '$.heartbeat_windows') as windows
  from lifecycle
  where event_type in ('TRIGGER_REQUESTED', 'NEXT_WINDOW_REQUESTED')
),

latest_request as {{ heartbeat_latest('sequence_requests', 'trigger_job_id') }},

latest_lifecycle as {{ heartbeat_latest('lifecycle', 'trigger_job_id') }},

paused as (
  select trigger_job_id, max(case when job_state = 'PAUSED' then 1 else 0 end) = 1 as is_paused
  from {{ ref('heartbeat_control') }}
  where is_active
  group by trigger_job_id
)

select
  r.trigger_job_id,
  r.run,
  r.runs,
  r.windows,
  r.idempotency_token,
  r.event_ts as requested_at,
  l.event_type as last_lifecycle_event,
  coalesce(p.is_paused, false) as is_paused,
  (l.event_type = 'COMPLETED' and r.run < r.runs) as next_run_due,
  (l.event_type = 'COMPLETED' and r.run >= r.runs) or l.event_type = 'RESET' as is_finished
from latest_request r
join latest_lifecycle l on l.trigger_job_id = r.trigger_job_id
left join paused p on p.trigger_job_id = r.trigger_job_id
where r.runs is not null
