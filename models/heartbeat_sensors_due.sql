{#
  What the next tick senses: the due half of heartbeat_sensor_plan (each distinct source
  read by at least one eligible row, with the cursor it has reached). The runner reads the
  plan whole; this view is for people and other products.
#}
{{ config(materialized='view') }}

select
  source_key, sensor_source, sensor_id, upstream_key, preprocess_query, sensor_read_type, cursor,
  cursor_event_id, trigger_job_ids
from {{ ref('heartbeat_sensor_plan') }}
where is_due
