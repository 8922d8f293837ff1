{#
  Runs for `python -m heartbeat_runner runs`: every finished or FAILED tick (heartbeat_runs and its
  archive; a streak of idle ticks is one row; a FAILED tick's row carries the run id of any events it wrote)
  with its number of skipped sources, plus ticks that wrote events but never
  finished (the runner stopped mid-tick, e.g. a crash) as status INCOMPLETE; the
  next tick carries on from what they wrote.
#}
{{ config(materialized='view') }}

{# hot and archived summaries; a row in both after a crash while archiving is an exact copy #}
with runs as (
  select * from {{ source('heartbeat', 'heartbeat_runs') }}
  union
  select * from {{ source('heartbeat', 'heartbeat_runs_archive') }}
),

skipped as (
  select run_id, count(*) as sources_skipped
  from {{ ref('heartbeat_run_report_all') }}
  where outcome = 'SKIPPED'
  group by run_id
),

{# Only ticks write these event types (CLI commands write others), so their run ids are ticks. #}
unfinished as (
  select e.run_id, min(e.snapshot_ts) as snapshot_ts, count(*) as events_written
  from {{ heartbeat_events(all_history=true) }} e
  left anti join runs r on r.run_id = e.run_id
  where e.event_type in ('NEW_DATA', 'CURSOR', 'TRIGGER_REQUESTED', 'TRIGGERED', 'TRIGGER_ERROR')
  group by e.run_id
)

select
  r.run_id, r.snapshot_ts, r.ended_ts, r.duration_s, r.status,
  r.sources_sensed, r.sources_with_new_data, coalesce(s.sources_skipped, 0) as sources_skipped,
  r.sensor_errors, r.jobs_triggered, r.jobs_completed, r.jobs_failed, r.trigger_errors, r.message,
  r.stage_timings
from runs r
left join skipped s on s.run_id = r.run_id

union all

select
  u.run_id, u.snapshot_ts, cast(null as timestamp), cast(null as double), 'INCOMPLETE',
  cast(null as int), cast(null as int), cast(null as bigint),
  cast(null as int), cast(null as int), cast(null as int), cast(null as int), cast(null as int),
  concat(cast(u.events_written as string), ' event(s) written, then the runner stopped before the end of the tick'),
  cast(null as string)
from unfinished u
