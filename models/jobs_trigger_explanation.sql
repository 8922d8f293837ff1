{#
  Why each job did or did not trigger: one row per control row (retired rows too),
  with the state of that dependency, the last evaluation of its source in the run
  report, and the job's one-line verdict. `python -m heartbeat_runner explain
  --job-id ID` prints it. The verdict reads the same rule as jobs_ready_to_trigger
  (heartbeat_job_rollup), in this order: paused, already running, blocked by a
  failure, no hard dependency, ready (or ready but the jobs API refused the last
  call: asked again next tick), waiting for hard dependencies.
#}
{{ config(materialized='view') }}

with control_rows as (
  select * from {{ ref('heartbeat_control') }}
),

last_evaluation as {{ heartbeat_last_evaluations() }},

rows_explained as (
  select
    c.trigger_job_id,
    c.trigger_job_name,
    c.sensor_source,
    c.sensor_id,
    c.source_key,
    case when c.is_hard then 'hard' else 'soft' end as dependency,
    c.is_active,
    c.retired_timestamp,
    c.job_state,
    c.status,
    c.status_change_timestamp,
    c.pending_events,
    c.job_run_id,
    c.last_error,
    r.run_id as last_evaluation_run_id,
    r.snapshot_ts as last_evaluated_at,
    r.outcome as last_outcome,
    r.error as last_outcome_detail,
    case when r.outcome = 'ERROR' then r.error end as sensing_error,
    {# sensing worked but something needs fixing, e.g. a follow key that matches nothing #}
    case when r.outcome in ('NEW_DATA', 'NO_NEW_DATA') then r.error end as sensing_warning,
    case
      when not c.is_active then 'retired: no longer in the config, ignored'
      when c.job_state = 'PAUSED' then 'paused'
      when c.status = 'IN_PROGRESS' then 'job running'
      when c.status = 'FAILED' then 'job failed'
      when c.status = 'REFUSED' then 'run refused by the jobs service'
      when c.status = 'NEW_EVENT_AVAILABLE' then concat('new data (', cast(c.pending_events as string), ' event(s))')
      when r.outcome = 'ERROR' then concat('sensing failed: ', r.error)
      when c.is_hard then concat('no new data yet', coalesce(concat(' (warning: ', r.error, ')'), ''))
      else concat('no new data (soft: does not block)', coalesce(concat(' (warning: ', r.error, ')'), ''))
    end as row_state
  from control_rows c
  left join last_evaluation r on r.source_key = c.source_key
),

hard_rows_waiting as (
  select
    trigger_job_id,
    count(*) as waiting_count,
    concat_ws(', ', sort_array(collect_list(concat(
      sensor_source, ':', sensor_id,
      case
        when sensing_error is not null then concat(' (sensing failed: ', sensing_error, ')')
        when sensing_warning is not null then concat(' (warning: ', sensing_warning, ')')
        else ''
      end
    )))) as waiting_for
  from rows_explained
  where is_active and dependency = 'hard' and coalesce(status, '') <> 'NEW_EVENT_AVAILABLE'
  group by trigger_job_id
),

sequences as (
  select * from {{ ref('heartbeat_job_sequences') }}
),

event_windows as (
  select
    *,
    concat('[', cast(from_unixtime(next_window_start_s) as string), ', ',
           cast(from_unixtime(next_window_end_s) as string), ')') as next_window
  from {{ ref('heartbeat_job_windows') }}
),

job_runs as (
  select trigger_job_id, max(job_run_id) as job_run_id, max(last_error) as failure
  from control_rows
  where is_active
  group by trigger_job_id
),

verdicts as (
  select
    j.trigger_job_id,
    j.is_ready,
    case
      when j.rows_paused > 0 then 'paused: not sensed or triggered until resumed'
      when j.rows_in_progress > 0 and r.job_run_id is null
        then concat('trigger requested', {{ heartbeat_sequence_note('s') }},
                    ', no run id yet: the next tick asks the jobs API again (same idempotency token)')
      when j.rows_in_progress > 0
        then concat('already running (run ', r.job_run_id, {{ heartbeat_sequence_note('s') }},
                    '): not triggered again until it finishes')
      when j.rows_failed > 0
        then concat('blocked by failure: ', coalesce(r.failure, 'the last run failed'), '; waits for a successful run')
      when j.rows_refused > 0
        then concat('blocked: ', coalesce(r.failure, 'the jobs service refused the last run'))
      when j.next_window_due
        then concat('catch-up: run ', cast(s.run as string), ' of ', cast(s.runs as string),
                    ' succeeded; run ', cast(s.run + 1 as string), ' is requested at the next tick')
      when j.hard_rows = 0 then 'config error: no hard dependency (soft rows never trigger alone)'
      when j.is_windowed and ew.next_window_start_s is null
        then concat('event-time windows of ', cast(ew.size_s as string), ' s: no event time recorded yet (',
                    coalesce(ew.source_event_times, 'no source'), ')')
      when j.is_windowed and ew.next_window_final
        then concat('event-time window ', ew.next_window, ' is final: triggers at the next tick')
      when j.is_windowed and ew.watermark_s is null
        then concat('event-time window ', ew.next_window, ' waits for an event time from every hard source (',
                    ew.source_event_times, ')')
      when j.is_windowed
        then concat('event-time window ', ew.next_window, ' waits for the watermark (now ',
                    cast(from_unixtime(ew.watermark_s) as string), ', lateness ', cast(ew.lateness_s as string),
                    ' s) to pass its end; latest event times: ', ew.source_event_times)
      when j.is_ready and r.failure is not null
        then concat('trigger call failed: ', r.failure,
                    '; the next tick asks the jobs API again with the same idempotency token')
      when j.is_ready then 'ready: triggers at the next tick'
      when w.waiting_count = 1 then concat('waiting for new data on hard dependency ', w.waiting_for)
      when w.waiting_count > 1 then concat('waiting for new data on hard dependencies ', w.waiting_for)
      else 'waiting for new data'
    end as verdict
  from {{ ref('heartbeat_job_rollup') }} j
  left join job_runs r on r.trigger_job_id = j.trigger_job_id
  left join hard_rows_waiting w on w.trigger_job_id = j.trigger_job_id
  left join sequences s on s.trigger_job_id = j.trigger_job_id
  left join event_windows ew on ew.trigger_job_id = j.trigger_job_id
)

select
  e.*,
  coalesce(v.is_ready, false) as is_ready,
  coalesce(v.verdict, 'not active: every row of this job is retired') as verdict
from rows_explained e
left join verdicts v on v.trigger_job_id = e.trigger_job_id
