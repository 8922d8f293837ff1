{#
  What the next tick does with each active source, in one read: sense it (is_due, with the
  cursor it has reached) or leave it out (with the reason). A source is due when at least
  one active row reading it is eligible (job UNPAUSED, status NULL or COMPLETED, or a job
  with an event-time window policy or a trigger policy with a quiet period, which keep
  sensing while their data waits: a quiet period must see new arrivals); several jobs sharing a source
  make one row, so the source is read once. A due source's columns come from its eligible
  rows; a skipped source's from all its rows, its reason naming why each job does not ask
  for it, e.g. "J1 paused; J2 in progress".

  The cursor comes straight from the events (the latest NEW_DATA, CURSOR or RESET of the
  source), so it is current even if the control table was not rebuilt after the last
  tick's events (e.g. after a crash); cursor_event_id is that event, the parent of the next
  NEW_DATA event's id; cursor_ts the start of the tick that recorded it. heartbeat_sensors_due and heartbeat_sensors_skipped are its two halves.
#}
{{ config(materialized='view') }}

with active_rows as (
  select
    c.source_key, c.sensor_source, c.sensor_id, c.upstream_key, c.preprocess_query, c.sensor_read_type,
    c.trigger_job_id,
    {{ heartbeat_not_sensed_reason('w.trigger_job_id is not null or t.trigger_job_id is not null') }} as not_sensed_reason
  from {{ ref('heartbeat_control') }} c
  left join {{ source('heartbeat', 'heartbeat_window_policies') }} w on w.trigger_job_id = c.trigger_job_id
  left join {{ source('heartbeat', 'heartbeat_trigger_policies') }} t
    on t.trigger_job_id = c.trigger_job_id and t.quiet_for_s > 0
  where c.is_active
),

marked as (
  select
    a.*,
    max(case when a.not_sensed_reason is null then 1 else 0 end) over (partition by a.source_key) = 1 as is_due
  from active_rows a
),

by_source as (
  select
    source_key,
    is_due,
    max(sensor_source) as sensor_source,
    max(sensor_id) as sensor_id,
    max(upstream_key) as upstream_key,
    max(preprocess_query) as preprocess_query,
    max(sensor_read_type) as sensor_read_type,
    concat_ws(',', sort_array(collect_set(trigger_job_id))) as trigger_job_ids,
    case
      when not is_due then concat_ws('; ', sort_array(collect_set(concat(trigger_job_id, ' ', not_sensed_reason))))
    end as reason
  from marked
  {# a due source counts its eligible rows only #}
  where not is_due or not_sensed_reason is null
  group by source_key, is_due
),

cursors as {{ heartbeat_latest_cursors() }}

select
  s.source_key,
  s.is_due,
  s.sensor_source,
  s.sensor_id,
  s.upstream_key,
  s.preprocess_query,
  s.sensor_read_type,
  c.cursor_to as cursor,
  c.event_id as cursor_event_id,
  {# when the tick that took the cursor began: every commit after the cursor's version was made after it #}
  c.snapshot_ts as cursor_ts,
  s.trigger_job_ids,
  s.reason
from by_source s
left join cursors c on c.source_key = s.source_key
