{#
  Bounded catch-up sequences (policies/catch_up.py): one row per job whose latest trigger request
  belongs to a sequence, i.e. a backlog cut into runs of at most the job's max_window. The
  request that starts a sequence (TRIGGER_REQUESTED) records the plan; each next run is a
  NEXT_WINDOW_REQUESTED, requested by the runner in the same commit as the success of the
  run before it. `next_run_due` is true when the latest run succeeded and runs are left (a
  success recorded some other way: `complete`, or a manual run found after a failure): the
  runner requests the next run at its next tick, and the dependency rule triggers nothing
  else for the job meanwhile. A RESET ends the sequence.
#}
{{ config(materialized='view') }}

{#
  From the control table's job columns (each job's latest lifecycle event and the sequence of its
  latest first-try or next-window request, derived in its build): read at every tick that may
  trigger, this view scans no events. Jobs no longer in the config have no sequence to go on with.
#}
with jobs as (
  select
    trigger_job_id,
    max(base_idempotency_token) as idempotency_token,
    max(base_requested_ts) as requested_at,
    max(sequence_run) as run,
    max(sequence_runs) as runs,
    max(sequence_windows) as windows,
    max(last_lifecycle_event) as last_lifecycle_event,
    max(case when job_state = 'PAUSED' then 1 else 0 end) = 1 as is_paused
  from {{ ref('heartbeat_control') }}
  where is_active
  group by trigger_job_id
)

select
  trigger_job_id,
  run,
  runs,
  windows,
  idempotency_token,
  requested_at,
  last_lifecycle_event,
  is_paused,
  (last_lifecycle_event = 'COMPLETED' and run < runs) as next_run_due,
  (last_lifecycle_event = 'COMPLETED' and run >= runs) or last_lifecycle_event = 'RESET' as is_finished
from jobs
where runs is not null
