{#
  The dependency rule: which jobs to trigger now. One row per ready job.

  A job is ready when, over its active rows in the control table:
    - at least one row is NEW_EVENT_AVAILABLE,
    - every hard row (dependency_flag TRUE) is NEW_EVENT_AVAILABLE,
    - no row is IN_PROGRESS (it is already running),
    - no row is FAILED (a failed job waits for a successful run),
    - no row is PAUSED (pausing never leads to a surprise trigger),
    - it has at least one hard row (soft rows never trigger alone).

  Scenario A: J1 hard + J2 hard -> both must be NEW_EVENT_AVAILABLE.
  Scenario B: J1 hard + J2 soft -> J1 alone suffices; J2's new data, if any, rides along.
#}
{{ config(materialized='view') }}

with job_rows as (
  select *
  from {{ ref('heartbeat_control') }}
  where is_active
)

select
  trigger_job_id,
  max(trigger_job_name) as trigger_job_name,
  count(*) as dependency_rows,
  sum(case when is_hard then 1 else 0 end) as hard_rows,
  sum(case when status = 'NEW_EVENT_AVAILABLE' then 1 else 0 end) as rows_with_new_events,
  {# the NEW_DATA events this trigger consumes: the input of its idempotency token #}
  concat_ws(',', sort_array(collect_list(pending_event_ids))) as consumed_event_ids,
  min(status_change_timestamp) as waiting_since
from job_rows
group by trigger_job_id
having
  sum(case when status = 'NEW_EVENT_AVAILABLE' then 1 else 0 end) >= 1
  and sum(case when is_hard and coalesce(status, '') <> 'NEW_EVENT_AVAILABLE' then 1 else 0 end) = 0
  and sum(case when status = 'IN_PROGRESS' then 1 else 0 end) = 0
  and sum(case when status = 'FAILED' then 1 else 0 end) = 0
  and sum(case when job_state = 'PAUSED' then 1 else 0 end) = 0
  and sum(case when is_hard then 1 else 0 end) >= 1
