{#
  What the next tick senses: each distinct source read by at least one row that is
  eligible (active, job UNPAUSED, status NULL or COMPLETED), with the cursor it has
  reached. Several jobs sharing a source make one row here, so the source is read
  once. The cursor comes straight from the events (the latest NEW_DATA, CURSOR or
  RESET of the source), so it is current even if the control table was not rebuilt
  after the last tick's events (e.g. after a crash); cursor_event_id is that event,
  the parent of the next NEW_DATA event's id. Sources left out are listed, with the
  reason, in heartbeat_sensors_skipped.
#}
{{ config(materialized='view') }}

with eligible as (
  select c.*
  from {{ ref('heartbeat_control') }} c
  left join {{ source('heartbeat', 'heartbeat_window_policies') }} w on w.trigger_job_id = c.trigger_job_id
  where c.is_active and {{ heartbeat_not_sensed_reason('w.trigger_job_id is not null') }} is null
),

cursors as {{ heartbeat_latest_cursors() }}

select
  e.source_key,
  max(e.sensor_source) as sensor_source,
  max(e.sensor_id) as sensor_id,
  max(e.upstream_key) as upstream_key,
  max(e.preprocess_query) as preprocess_query,
  max(e.sensor_read_type) as sensor_read_type,
  max(c.cursor_to) as cursor,
  max(c.event_id) as cursor_event_id,
  concat_ws(',', sort_array(collect_set(e.trigger_job_id))) as trigger_job_ids
from eligible e
left join cursors c on c.source_key = e.source_key
group by e.source_key
