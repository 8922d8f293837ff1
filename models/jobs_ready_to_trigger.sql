{#
  The dependency rule: which jobs to trigger now, one row per ready job. The rule
  itself (with scenarios A and B) is in heartbeat_job_rollup, which
  jobs_trigger_explanation reads too, so the two can never disagree.
#}
{{ config(materialized='view') }}

select
  trigger_job_id, trigger_job_name, dependency_rows, hard_rows, rows_with_new_events,
  consumed_event_ids, waiting_since
from {{ ref('heartbeat_job_rollup') }}
where is_ready
