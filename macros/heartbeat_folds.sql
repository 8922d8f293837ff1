{#
  The folds: each MERGE brings the control rows one commit of a tick changes to what
  models/heartbeat_control.sql would derive from all the events, without deriving the others. The runner
  compiles each once with dbt and runs it itself (lakehouse/control_table.py: ControlTable.refresh, Appended,
  FoldStep).

  One derivation: no fold restates a per-row rule. The rules (status and its change time, the run's start and
  end, whether an event is pending, the pending ids, consecutive failures, the last error, the sequence) live
  once in macros/heartbeat_row_rules.sql, and the model calls them on what it aggregated from all the events.
  A fold computes the new inputs of those rules from the row as built and the commit (the new latest lifecycle
  event, the new pending count, ...) and calls the same macros; every ruled column a fold assigns is one call
  of its rule. tests/test_row_rules.py checks that by the SQL text; tests/test_fold.py compares folded tables
  with ones derived from all the events, and shows that a rule changed on the fold path alone is caught.

  A MERGE's assignments all read the row as built (the old values): a rule that reads another ruled column
  (the status change reads the status) is given that column's rule again, not the column.
#}

{#
  Folding one tick's new data into the control table, as one MERGE the runner runs itself
  (lakehouse/control_table.py, NewDataSpan; compiled once by dbt, then run without it).

  `new_data` is a relation the runner fills with the NEW_DATA events it has just appended, at
  most one per source: source_key, event_id, event_ts, snapshot_ts, window_from, window_to.
  The runner folds only when that append is the one commit since the control table's last build
  and it holds NEW_DATA and CURSOR events only (CURSOR events change no control row). Such events
  change only the rows of their sources; the new inputs of the rules are:

  - the row's job's latest lifecycle event is unchanged (new data is not a lifecycle event);
  - the event is pending for the row (heartbeat_is_pending) unless the row was created after it: the
    job's latest trigger request or reset is an event recorded before this append, so of the
    derivation's `consumed_after` only the row's creation can come later;
  - a pending event adds one to the pending count and joins the pending ids; it opens the pending
    window when nothing was pending and always ends it (it is the latest);
  - the first pending event is the earliest already pending (a row waiting for data keeps its time
    as its status change, heartbeat_built_first_pending_ts), else this event;
  - the job's latest lifecycle time, its request and its run's end are the row's as built (the status
    columns keep them where the rules read them).

  The row's latest fetch is the new event's snapshot. Every other column, and every other row, stays as
  built. The MERGE reads the control table once (its assignments read each row as built): this fold is on
  the path from a change to its job's start.
#}
{% macro heartbeat_fold_new_data(new_data) -%}
{#- every right-hand side reads the row as built (a MERGE's assignments see the old values) -#}
{%- set pending = heartbeat_is_pending('n.event_ts', 'control.row_created_timestamp') -%}
{%- set pending_events = "(control.pending_events + case when " ~ pending ~ " then 1 else 0 end)" -%}
{%- set built_ids = "coalesce(split(control.pending_event_ids, ','), array())" -%}
{%- set pending_ids = "case when " ~ pending ~ " then concat(" ~ built_ids ~ ", array(n.event_id)) else " ~ built_ids ~ " end" -%}
{%- set first_pending_ts = "case when control.pending_events > 0 then " ~ heartbeat_built_first_pending_ts('control')
                           ~ " when " ~ pending ~ " then n.event_ts end" -%}
{%- set status = heartbeat_row_status('control.last_lifecycle_event', pending_events) -%}
merge into {{ ref('heartbeat_control') }} as control
using {{ new_data }} as n
on n.source_key = control.source_key and control.is_active
when matched then update set
  latest_event_fetched_timestamp = greatest(coalesce(control.latest_event_fetched_timestamp, n.snapshot_ts), n.snapshot_ts),
  status = {{ heartbeat_row_status('control.last_lifecycle_event', pending_events) }},
  status_change_timestamp = {{ heartbeat_status_change_ts(status, first_pending_ts, heartbeat_built_lifecycle_ts('control')) }},
  job_start_timestamp = {{ heartbeat_job_start_ts(status, 'control.job_start_timestamp') }},
  job_end_timestamp = {{ heartbeat_job_end_ts(status, 'control.last_lifecycle_event', 'control.job_end_timestamp') }},
  pending_events = {{ pending_events }},
  pending_event_ids = {{ heartbeat_pending_ids(pending_ids) }},
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
  request changes only its job's active rows; the new inputs of the rules are: the request is the job's
  latest lifecycle event, its request and the base a retry re-runs (its token, its run, the sequence its
  payload plans); nothing is pending (every NEW_DATA event of their sources came before it, so none is
  pending after it); no failure since it, and no refusal (a TRIGGER_ERROR makes the span unfoldable).
  Every other row stays as built.
#}
{% macro heartbeat_fold_requests(requests) -%}
{%- set lifecycle_event = "'TRIGGER_REQUESTED'" -%}
{%- set nothing_pending = "cast(0 as bigint)" -%}
{%- set status = heartbeat_row_status(lifecycle_event, nothing_pending) -%}
merge into {{ ref('heartbeat_control') }} as control
using (
  select c.sensor_source, c.sensor_id, c.trigger_job_id, r.idempotency_token, r.event_ts, r.payload, r.job_run_id
  from {{ ref('heartbeat_control') }} c
  join {{ requests }} r on r.trigger_job_id = c.trigger_job_id
  where c.is_active
) as folded
on {{ heartbeat_control_row_match('control', 'folded') }}
when matched then update set
  status = {{ heartbeat_row_status(lifecycle_event, nothing_pending) }},
  status_change_timestamp = {{ heartbeat_status_change_ts(status, 'cast(null as timestamp)', 'folded.event_ts') }},
  job_start_timestamp = {{ heartbeat_job_start_ts(status, 'folded.event_ts') }},
  job_end_timestamp = {{ heartbeat_job_end_ts(status, lifecycle_event,
                                              heartbeat_lifecycle_end_ts(heartbeat_run_ended_at('folded.payload'), 'folded.event_ts')) }},
  pending_events = {{ nothing_pending }},
  pending_event_ids = {{ heartbeat_pending_ids('cast(array() as array<string>)') }},
  pending_window_from = cast(null as string),
  pending_window_to = cast(null as string),
  job_run_id = folded.job_run_id,
  last_idempotency_token = folded.idempotency_token,
  base_idempotency_token = folded.idempotency_token,
  consecutive_failures = {{ heartbeat_consecutive_failures('0', 'cast(null as array<timestamp>)', 'folded.event_ts') }},
  last_error = {{ heartbeat_last_error(lifecycle_event, 'cast(null as string)', 'folded.event_ts',
                                       'cast(null as timestamp)', 'cast(null as string)') }},
  updated_at = current_timestamp(),
  last_lifecycle_event = {{ lifecycle_event }},
  base_requested_ts = folded.event_ts,
  sequence_run = {{ heartbeat_sequence_run('folded.payload') }},
  sequence_runs = {{ heartbeat_sequence_runs('folded.payload') }},
  sequence_windows = {{ heartbeat_sequence_windows('folded.payload') }}
{%- endmacro %}

{#
  Folding the ends of runs into the control table, as one MERGE the runner runs itself.

  `ends` is a relation the runner fills with the run ends (heartbeat_run_end_types) of one commit, one per job:
  trigger_job_id, event_type, event_ts, message, payload (a run's own end time as `run_ended_at`). The
  runner folds them only in a span it can fold (lakehouse/control_table.py, Appended), onto the rows as
  the folds before it left them. Such an event is its job's latest lifecycle event; the new inputs of the
  rules, for every active row of the job, are:

  - the event as the latest lifecycle event (its type, time, message and the run's end);
  - what is pending stays as it was (data that arrived during the run), and the first of it, read from
    the events table for the rows that have any;
  - the run's start is its request's, as built (the row was IN_PROGRESS); the base a retry re-runs too:
    a FAILED or REFUSED event is one more unsuccessful end since it;
  - no refusal of a request since the event (it is the latest commit).

  The run's tokens, its sequence and what is pending stay as they were.
#}
{% macro heartbeat_fold_ends(ends) -%}
{%- set status = heartbeat_row_status('folded.event_type', 'folded.pending_events') -%}
merge into {{ ref('heartbeat_control') }} as control
using (
  select
    c.sensor_source, c.sensor_id, c.trigger_job_id, c.consecutive_failures, c.job_start_timestamp,
    c.pending_events, c.base_requested_ts,
    e.event_type, e.event_ts, e.message, e.payload,
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
  status = {{ heartbeat_row_status('folded.event_type', 'folded.pending_events') }},
  status_change_timestamp = {{ heartbeat_status_change_ts(status, 'folded.first_pending_ts', 'folded.event_ts') }},
  job_start_timestamp = {{ heartbeat_job_start_ts(status, 'folded.job_start_timestamp') }},
  job_end_timestamp = {{ heartbeat_job_end_ts(status, 'folded.event_type',
                                              heartbeat_lifecycle_end_ts(heartbeat_run_ended_at('folded.payload'), 'folded.event_ts')) }},
  consecutive_failures = {{ heartbeat_consecutive_failures(
    'folded.consecutive_failures', "case when folded.event_type in ('FAILED', 'REFUSED') then array(folded.event_ts) end",
    'folded.base_requested_ts') }},
  last_error = {{ heartbeat_last_error('folded.event_type', 'folded.message', 'folded.event_ts',
                                       'cast(null as timestamp)', 'cast(null as string)') }},
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
