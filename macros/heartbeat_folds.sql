{#
  Folding one tick's new data into the control table, as one MERGE the runner runs itself
  (lakehouse/control_table.py, NewDataSpan; compiled once by dbt, then run without it).

  `new_data` is a relation the runner fills with the NEW_DATA events it has just appended, at
  most one per source: source_key, event_id, event_ts, snapshot_ts, window_from, window_to.
  The runner folds only when that append is the one commit since the control table's last build
  and it holds NEW_DATA and CURSOR events only (CURSOR events change no control row). Such events
  change only the rows of their sources, and each to what models/heartbeat_control.sql would
  derive from all the events:

  - the row's latest fetch is the new event's snapshot;
  - the event is pending for the row unless the row was created after it (the derivation's
    `event_ts > consumed_after`: the job's latest trigger request or reset is an event recorded
    before this append, so only the row's creation can come later);
  - a pending event joins the pending ids (sorted) and counts; it opens the pending window when
    nothing was pending and always ends it (it is the latest);
  - the row's status becomes NEW_EVENT_AVAILABLE unless its job is IN_PROGRESS or FAILED, which
    new data does not change; a row that becomes NEW_EVENT_AVAILABLE takes the event's time as
    its status change and loses its run's start and end, as derived rows do.

  Every other column, and every other row, stays as built. tests/test_fold.py compares folded
  tables with ones derived from all the events. The MERGE reads the control table once (its
  assignments read each row as built): this fold is on the path from a change to its job's start.
#}
{% macro heartbeat_fold_new_data(new_data) -%}
{#- every right-hand side reads the row as built (a MERGE's assignments see the old values) -#}
{%- set pending = "n.event_ts > control.row_created_timestamp" -%}
{%- set becomes_ready = "(" ~ pending ~ " and coalesce(control.status, '') not in ('IN_PROGRESS', 'FAILED', 'NEW_EVENT_AVAILABLE'))" -%}
merge into {{ ref('heartbeat_control') }} as control
using {{ new_data }} as n
on n.source_key = control.source_key and control.is_active
when matched then update set
  latest_event_fetched_timestamp = greatest(coalesce(control.latest_event_fetched_timestamp, n.snapshot_ts), n.snapshot_ts),
  status = case when {{ becomes_ready }} then 'NEW_EVENT_AVAILABLE' else control.status end,
  status_change_timestamp = case when {{ becomes_ready }} then n.event_ts else control.status_change_timestamp end,
  job_start_timestamp = case when {{ becomes_ready }} then cast(null as timestamp) else control.job_start_timestamp end,
  job_end_timestamp = case when {{ becomes_ready }} then cast(null as timestamp) else control.job_end_timestamp end,
  pending_events = control.pending_events + case when {{ pending }} then 1 else 0 end,
  pending_event_ids = case
    when {{ pending }} then concat_ws(',', sort_array(concat(coalesce(split(control.pending_event_ids, ','), array()), array(n.event_id))))
    else control.pending_event_ids
  end,
  pending_window_from = case when {{ pending }} and control.pending_events = 0 then n.window_from else control.pending_window_from end,
  pending_window_to = case when {{ pending }} then n.window_to else control.pending_window_to end,
  updated_at = current_timestamp()
{%- endmacro %}

{#
  Folding one tick's trigger requests into the control table, as one MERGE the runner runs itself.

  `requests` is a relation the runner fills with the TRIGGER_REQUESTED events it appended since the
  control table's last build, one per job, each with the run its TRIGGERED answer started (none yet:
  NULL): trigger_job_id, idempotency_token, event_ts, payload, job_run_id. The runner folds only when
  those requests and their answers are all it appended since (lakehouse/control_table.py, Appended). A
  request changes only its job's active rows, and models/heartbeat_control.sql would derive exactly this
  for them: IN_PROGRESS since the request, its token and run, the sequence its payload plans, nothing
  pending (every NEW_DATA event of their sources came before it), no failure or error since. Every other
  row stays as built. tests/test_fold.py compares folded tables with ones derived from all the events.
#}
{% macro heartbeat_fold_requests(requests) -%}
merge into {{ ref('heartbeat_control') }} as control
using (
  select c.sensor_source, c.sensor_id, c.trigger_job_id, r.idempotency_token, r.event_ts, r.payload, r.job_run_id
  from {{ ref('heartbeat_control') }} c
  join {{ requests }} r on r.trigger_job_id = c.trigger_job_id
  where c.is_active
) as folded
on {{ heartbeat_control_row_match('control', 'folded') }}
when matched then update set
  status = 'IN_PROGRESS',
  status_change_timestamp = folded.event_ts,
  job_start_timestamp = folded.event_ts,
  job_end_timestamp = cast(null as timestamp),
  pending_events = cast(0 as bigint),
  pending_event_ids = cast(null as string),
  pending_window_from = cast(null as string),
  pending_window_to = cast(null as string),
  job_run_id = folded.job_run_id,
  last_idempotency_token = folded.idempotency_token,
  base_idempotency_token = folded.idempotency_token,
  consecutive_failures = cast(0 as bigint),
  last_error = cast(null as string),
  updated_at = current_timestamp(),
  last_lifecycle_event = 'TRIGGER_REQUESTED',
  base_requested_ts = folded.event_ts,
  sequence_run = cast(get_json_object(folded.payload, '$._run') as int),
  sequence_runs = cast(get_json_object(folded.payload, '$._runs') as int),
  sequence_windows = get_json_object(folded.payload, '$.heartbeat_windows')
{%- endmacro %}

{#
  Folding the ends of runs into the control table, as one MERGE the runner runs itself.

  `ends` is a relation the runner fills with the COMPLETED and FAILED events of one commit, one per job:
  trigger_job_id, event_type, event_ts, message, payload (a run's own end time as `run_ended_at`). The
  runner folds them only in a span it can fold (lakehouse/control_table.py, Appended), onto the rows as
  the folds before it left them. Such an event is its job's latest lifecycle event, so
  models/heartbeat_control.sql would derive, for every active row of the job:

  - FAILED: FAILED since the event, the run's end, one more failure since the request a retry re-runs,
    the event's message as the error;
  - COMPLETED: COMPLETED since the event with the run's end and no error, or, when data of the row's
    source arrived during the run (pending), NEW_EVENT_AVAILABLE since the first of it, without a run;
  - the run's start (its request), its tokens, its sequence and what is pending stay as they were.

  The first pending event's time is read from the events table for the rows that have any.
#}
{% macro heartbeat_fold_ends(ends) -%}
merge into {{ ref('heartbeat_control') }} as control
using (
  select
    c.sensor_source, c.sensor_id, c.trigger_job_id, c.consecutive_failures, c.job_start_timestamp,
    e.event_type, e.event_ts, e.message,
    coalesce(cast(get_json_object(e.payload, '$.run_ended_at') as timestamp), e.event_ts) as ended_ts,
    e.event_type = 'COMPLETED' and c.pending_events > 0 as data_waits,
    p.first_pending_ts
  from {{ ref('heartbeat_control') }} c
  join {{ ends }} e on e.trigger_job_id = c.trigger_job_id
  left join (
    select w.sensor_source, w.sensor_id, w.trigger_job_id, min(n.event_ts) as first_pending_ts
    from (
      select r.sensor_source, r.sensor_id, r.trigger_job_id, explode(split(r.pending_event_ids, ',')) as event_id
      from {{ ref('heartbeat_control') }} r
      join {{ ends }} x on x.trigger_job_id = r.trigger_job_id
      where r.is_active and r.pending_events > 0
    ) w
    join {{ source('heartbeat', 'heartbeat_events') }} n on n.event_id = w.event_id and n.event_type = 'NEW_DATA'
    group by w.sensor_source, w.sensor_id, w.trigger_job_id
  ) p on p.sensor_source = c.sensor_source and p.sensor_id = c.sensor_id and p.trigger_job_id = c.trigger_job_id
  where c.is_active
) as folded
on {{ heartbeat_control_row_match('control', 'folded') }}
when matched then update set
  status = case
    when folded.event_type = 'FAILED' then 'FAILED'
    when folded.data_waits then 'NEW_EVENT_AVAILABLE'
    else 'COMPLETED'
  end,
  status_change_timestamp = case when folded.data_waits then folded.first_pending_ts else folded.event_ts end,
  job_start_timestamp = case when folded.data_waits then cast(null as timestamp) else folded.job_start_timestamp end,
  job_end_timestamp = case when folded.data_waits then cast(null as timestamp) else folded.ended_ts end,
  consecutive_failures = folded.consecutive_failures + case when folded.event_type = 'FAILED' then 1 else 0 end,
  last_error = case when folded.event_type = 'FAILED' then folded.message end,
  last_lifecycle_event = folded.event_type,
  updated_at = current_timestamp()
{%- endmacro %}

{# A fold's MERGE matches a control row by its key (the control model's unique key). #}
{% macro heartbeat_control_row_match(target, source) -%}
{{ target }}.sensor_source = {{ source }}.sensor_source
  and {{ target }}.sensor_id = {{ source }}.sensor_id
  and {{ target }}.trigger_job_id = {{ source }}.trigger_job_id
{%- endmacro %}

{#
  One digest per control row of everything a fold or a build decides (every column but updated_at, the time of
  the write itself): maintenance compares the folded table's digests with those of the same table derived by dbt
  (lakehouse/control_table.py, ControlTable.check_folds). Read by the runner without a dbt command.
#}
{% macro heartbeat_control_row_digests() -%}
select
  sensor_source, sensor_id, trigger_job_id,
  md5(to_json(named_struct(
    'sensor_read_type', sensor_read_type, 'asset_description', asset_description, 'upstream_key', upstream_key,
    'preprocess_query', preprocess_query, 'latest_event_fetched_timestamp', latest_event_fetched_timestamp,
    'trigger_job_name', trigger_job_name, 'status', status, 'status_change_timestamp', status_change_timestamp,
    'job_start_timestamp', job_start_timestamp, 'job_end_timestamp', job_end_timestamp, 'job_state', job_state,
    'dependency_flag', dependency_flag, 'is_hard', is_hard, 'source_key', source_key,
    'pending_events', pending_events, 'pending_event_ids', pending_event_ids,
    'pending_window_from', pending_window_from, 'pending_window_to', pending_window_to, 'job_run_id', job_run_id,
    'last_idempotency_token', last_idempotency_token, 'base_idempotency_token', base_idempotency_token,
    'consecutive_failures', consecutive_failures, 'last_error', last_error, 'is_active', is_active,
    'retired_timestamp', retired_timestamp, 'row_created_timestamp', row_created_timestamp,
    'last_lifecycle_event', last_lifecycle_event, 'base_requested_ts', base_requested_ts,
    'sequence_run', sequence_run, 'sequence_runs', sequence_runs, 'sequence_windows', sequence_windows
  ))) as digest
from {{ ref('heartbeat_control') }}
{%- endmacro %}
