{#
  The active control rows whose source failed at its latest evaluation, with the error: what
  `status` (and `status --watch`) marks as failing, and what a tick checks for recovery. The same
  rows as jobs_trigger_explanation where is_active and last_outcome = 'ERROR', without that
  view's verdicts: on Apache Spark this reads in a tenth of the time.
#}
{{ config(materialized='view') }}

{#
  failing_since: the first failed evaluation after the source's latest clean one. Every tick that senses a
  failing source again is recorded (a recovery is never idle), so no clean sensing hides between them. A
  runner that starts (a tick per process) reads it, so its alert thresholds count from the same instant
  as a loop's (runner/alerting.py).
#}
with last_clean as (
  select source_key, max(snapshot_ts) as clean_ts
  from {{ source('heartbeat', 'heartbeat_run_report') }}
  where outcome in ('NEW_DATA', 'NO_NEW_DATA')
  group by source_key
),

streaks as (
  select e.source_key, min(e.snapshot_ts) as failing_since
  from {{ source('heartbeat', 'heartbeat_run_report') }} e
  left join last_clean l on l.source_key = e.source_key
  where e.outcome = 'ERROR' and (l.clean_ts is null or e.snapshot_ts > l.clean_ts)
  group by e.source_key
)

select
  c.trigger_job_id,
  c.source_key,
  s.failing_since,
  r.error as sensing_error
from {{ ref('heartbeat_control') }} c
join {{ heartbeat_last_evaluations() }} r on r.source_key = c.source_key
left join streaks s on s.source_key = c.source_key
where c.is_active and r.outcome = 'ERROR'
