{#
  The dependency rule, one row per job over its active rows in the control table.
  Shared by jobs_ready_to_trigger (the jobs to trigger) and jobs_trigger_explanation
  (why a job is or is not ready), so the two can never disagree.

  A job is ready (is_ready) when:
    - at least one row is NEW_EVENT_AVAILABLE,
    - every hard row (dependency_flag TRUE) is NEW_EVENT_AVAILABLE,
    - no row is IN_PROGRESS (it is already running),
    - no row is FAILED (a failed job waits for a successful run),
    - no row is REFUSED (a job the jobs service refused waits for an operator's retry),
    - no row is PAUSED (pausing never leads to a surprise trigger),
    - it has at least one hard row (soft rows never trigger alone),
    - no run of a catch-up sequence is due (heartbeat_job_sequences: the backlog it
      consumed is run first, one window after the other),
    - it has no event-time window policy (such a job runs per final window instead:
      heartbeat_job_windows).

  Scenario A: J1 hard + J2 hard -> both must be NEW_EVENT_AVAILABLE.
  Scenario B: J1 hard + J2 soft -> J1 alone suffices; J2's new data, if any, rides along.
#}
{{ config(materialized='view') }}

with counts as (
  select
    trigger_job_id,
    max(trigger_job_name) as trigger_job_name,
    count(*) as dependency_rows,
    sum(case when is_hard then 1 else 0 end) as hard_rows,
    sum(case when status = 'NEW_EVENT_AVAILABLE' then 1 else 0 end) as rows_with_new_events,
    sum(case when is_hard and coalesce(status, '') <> 'NEW_EVENT_AVAILABLE' then 1 else 0 end) as hard_rows_waiting,
    sum(case when status = 'IN_PROGRESS' then 1 else 0 end) as rows_in_progress,
    sum(case when status = 'FAILED' then 1 else 0 end) as rows_failed,
    sum(case when status = 'REFUSED' then 1 else 0 end) as rows_refused,
    sum(case when job_state = 'PAUSED' then 1 else 0 end) as rows_paused,
    {# the NEW_DATA events a trigger consumes: the input of its idempotency token #}
    concat_ws(',', sort_array(collect_list(pending_event_ids))) as consumed_event_ids,
    min(status_change_timestamp) as waiting_since
  from {{ ref('heartbeat_control') }}
  where is_active
  group by trigger_job_id
)

select
  c.*,
  coalesce(s.next_run_due, false) as next_window_due,
  w.trigger_job_id is not null as is_windowed,
  (c.rows_with_new_events >= 1 and c.hard_rows_waiting = 0 and c.rows_in_progress = 0 and c.rows_failed = 0
   and c.rows_refused = 0 and c.rows_paused = 0 and c.hard_rows >= 1 and not coalesce(s.next_run_due, false)
   and w.trigger_job_id is null) as is_ready
from counts c
left join {{ ref('heartbeat_job_sequences') }} s on s.trigger_job_id = c.trigger_job_id
left join {{ source('heartbeat', 'heartbeat_window_policies') }} w on w.trigger_job_id = c.trigger_job_id
