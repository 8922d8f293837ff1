{#
  The dependency rule: which jobs to trigger now. One row per ready job.

  The rule lives in heartbeat_job_rollup (shared with jobs_trigger_explanation).
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

select
  trigger_job_id, trigger_job_name, dependency_rows, hard_rows, rows_with_new_events,
  consumed_event_ids, waiting_since
from {{ ref('heartbeat_job_rollup') }}
where is_ready
