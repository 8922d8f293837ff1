{#
  The control rows a trigger consumes: for each job in jobs_ready_to_trigger, its rows
  with new data, with the window each one covers. The runner builds one trigger
  request per job from these rows (its idempotency token hashes consumed_event_ids).
#}
{{ config(materialized='view') }}

select
  r.trigger_job_id, r.trigger_job_name, r.consumed_event_ids,
  c.sensor_source, c.sensor_id, c.source_key, c.upstream_key, c.pending_window_from, c.pending_window_to
from {{ ref('jobs_ready_to_trigger') }} r
join {{ ref('heartbeat_control') }} c
  on c.trigger_job_id = r.trigger_job_id and c.is_active and c.status = 'NEW_EVENT_AVAILABLE'
