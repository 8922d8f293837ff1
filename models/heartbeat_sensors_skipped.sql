{#
  The sources the next tick does not sense, and why: every active row reading them
  is paused, in progress, failed, or already has new data waiting to trigger.
  The run report records them as SKIPPED with this reason, e.g.
  "J1 paused; J2 in progress". The complement of heartbeat_sensors_due.
#}
{{ config(materialized='view') }}

with active_rows as (
  select
    c.source_key, c.sensor_source, c.sensor_id, c.trigger_job_id,
    {{ heartbeat_not_sensed_reason('w.trigger_job_id is not null') }} as not_sensed_reason
  from {{ ref('heartbeat_control') }} c
  left join {{ source('heartbeat', 'heartbeat_window_policies') }} w on w.trigger_job_id = c.trigger_job_id
  where c.is_active
)

select
  source_key,
  max(sensor_source) as sensor_source,
  max(sensor_id) as sensor_id,
  concat_ws(',', sort_array(collect_set(trigger_job_id))) as trigger_job_ids,
  concat_ws('; ', sort_array(collect_set(concat(trigger_job_id, ' ', not_sensed_reason)))) as reason
from active_rows
group by source_key
having sum(case when not_sensed_reason is null then 1 else 0 end) = 0
