{#
  The dependency rule for event-time windows (policies/event_windows.py), beside the one in
  heartbeat_job_rollup: one row per job with a window policy (heartbeat_window_policies).

  A source's event time is the latest one sensing recorded for it (NEW_DATA and baseline
  CURSOR payloads, event_time_max_s); its watermark for a job is that minus the job's
  lateness. The job's watermark is the smallest over its HARD sources, and NULL until every
  hard source has an event time: soft sources never hold a window back. The next window
  starts where the job's last plan ended (`_windows_until_s` of its trigger requests and
  WINDOW_SKIPPED events), or, at first, at the window holding the earliest event time its
  sources recorded after its rows were created. It is FINAL when the watermark has passed
  its end; `windows_due` adds that the job is free to run it (not paused, running, failed,
  or in the middle of a sequence). Times are epoch seconds (UTC).

  It reads the hot log only, so its cost does not grow with the lakehouse's age: a source's
  latest NEW_DATA/CURSOR and a job's plans since its latest settled request always stay there
  (heartbeat_events_live).
#}
{{ config(materialized='view') }}

with events as {{ heartbeat_events() }},

policies as (
  select * from {{ source('heartbeat', 'heartbeat_window_policies') }}
),

job_rows as (
  select c.trigger_job_id, c.source_key, c.sensor_source, c.sensor_id, c.is_hard, c.row_created_timestamp
  from {{ ref('heartbeat_control') }} c
  join policies p on p.trigger_job_id = c.trigger_job_id
  where c.is_active
),

timed as (
  select
    source_key, event_type, event_ts,
    cast(get_json_object(payload, '$.event_time_max_s') as bigint) as max_s,
    cast(get_json_object(payload, '$.event_time_min_s') as bigint) as min_s
  from events
  where event_type in ('NEW_DATA', 'CURSOR') and get_json_object(payload, '$.event_time_max_s') is not null
),

source_times as (
  select source_key, max(max_s) as event_time_s from timed group by source_key
),

marks as (
  select
    r.trigger_job_id,
    sum(case when r.is_hard then 1 else 0 end) as hard_sources,
    count(case when r.is_hard then t.event_time_s end) as hard_sources_with_time,
    min(case when r.is_hard then t.event_time_s - p.lateness_s end) as slowest_watermark_s,
    concat_ws('; ', sort_array(collect_list(concat(
      r.sensor_source, ':', r.sensor_id, case when r.is_hard then '' else ' (soft)' end, ' at ',
      coalesce(cast(from_unixtime(t.event_time_s) as string), 'no event time yet')
    )))) as source_event_times
  from job_rows r
  join policies p on p.trigger_job_id = r.trigger_job_id
  left join source_times t on t.source_key = r.source_key
  group by r.trigger_job_id
),

first_data as (
  select r.trigger_job_id, min(t.min_s) as first_s
  from job_rows r
  join timed t on t.source_key = r.source_key and t.event_type = 'NEW_DATA' and t.event_ts > r.row_created_timestamp
  group by r.trigger_job_id
),

lifecycle as {{ heartbeat_lifecycle('events') }},

plans as (
  select trigger_job_id, payload from lifecycle where event_type = 'TRIGGER_REQUESTED'
  union all
  select trigger_job_id, payload from events where event_type = 'WINDOW_SKIPPED'
),

planned as (
  select trigger_job_id, max(cast(get_json_object(payload, '$._windows_until_s') as bigint)) as planned_until_s
  from plans
  group by trigger_job_id
),

windows as (
  select
    p.trigger_job_id,
    p.size_s,
    p.lateness_s,
    p.late_data,
    case when m.hard_sources > 0 and m.hard_sources_with_time = m.hard_sources then m.slowest_watermark_s end
      as watermark_s,
    m.source_event_times,
    pl.planned_until_s,
    coalesce(pl.planned_until_s, cast(floor(f.first_s / p.size_s) * p.size_s as bigint)) as next_window_start_s
  from policies p
  left join marks m on m.trigger_job_id = p.trigger_job_id
  left join planned pl on pl.trigger_job_id = p.trigger_job_id
  left join first_data f on f.trigger_job_id = p.trigger_job_id
),

judged as (
  select
    w.*,
    w.next_window_start_s + w.size_s as next_window_end_s,
    coalesce(w.watermark_s >= w.next_window_start_s + w.size_s, false) as next_window_final,
    j.rows_in_progress = 0 and j.rows_failed = 0 and j.rows_refused = 0 and j.rows_paused = 0
      and not j.next_window_due as is_free
  from windows w
  join {{ ref('heartbeat_job_rollup') }} j on j.trigger_job_id = w.trigger_job_id
)

select d.*, d.next_window_final and d.is_free as windows_due
from judged d
