{#
  The sources the next tick does not sense, and why: the other half of
  heartbeat_sensor_plan (every active row reading them is paused, in progress, failed, or
  already has new data waiting to trigger). The run report records them as SKIPPED with
  this reason, e.g. "J1 paused; J2 in progress".
#}
{{ config(materialized='view') }}

select source_key, sensor_source, sensor_id, trigger_job_ids, reason
from {{ ref('heartbeat_sensor_plan') }}
where not is_due
