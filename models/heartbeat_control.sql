{#
  The control table: one row per (sensor_source, sensor_id, trigger_job_id).

  Config columns come from the seed; status and timestamps are derived from the
  events table (the hot log: maintenance moves only events this derivation can no
  longer read to the archive, see heartbeat_events_live), so it can always be rebuilt and
  a crash between steps of a tick can never leave it inconsistent.

  Status of a row (its job's lifecycle first, then its own source's data):
    IN_PROGRESS          the job's latest lifecycle event is an effective trigger request
    FAILED               the job's latest lifecycle event is a failure (blocks the job
                         until a successful run is recorded)
    REFUSED              the jobs service refused to run the job (it never executed; blocks
                         the job until an operator's retry or a successful run is recorded)
    NEW_EVENT_AVAILABLE  new data was sensed for this row's source after the job last
                         consumed it (its latest trigger, reset, or the row's creation)
    COMPLETED            the job's latest lifecycle event is a success
    NULL                 nothing happened yet (new row) or the job was reset

  This model aggregates each row's inputs (its job's latest lifecycle event, what is pending, ...); the
  per-row rules that turn them into the row's columns (status and its timestamps, the run's start and end,
  what is pending, consecutive failures, the last error, the sequence) live once in
  macros/heartbeat_row_rules.sql, which the folds call too.

  Rows removed from the config are retired (is_active = false), never deleted.

  A tick usually changes few rows: its new data and its trigger requests are folded into the rows
  they change by the MERGEs of macros/heartbeat_folds.sql, which give what this derivation would: they
  compute the new inputs of the same rules and call the same macros (tests/test_row_rules.py checks that
  neither side restates a rule, tests/test_fold.py that folded and derived tables are equal).
#}
{{
  config(
    materialized='incremental',
    incremental_strategy='merge',
    unique_key=['sensor_source', 'sensor_id', 'trigger_job_id'],
    pre_hook=["{{ heartbeat_unstage_events() }}", "{{ heartbeat_stage_events() }}"],
    post_hook="{{ heartbeat_unstage_events() }}",
  )
}}

with config as (
  select
    lower({{ heartbeat_clean('sensor_source') }}) as sensor_source,
    {{ heartbeat_clean('sensor_id') }} as sensor_id,
    coalesce(lower({{ heartbeat_clean('sensor_read_type') }}), 'batch') as sensor_read_type,
    {{ heartbeat_clean('asset_description') }} as asset_description,
    {{ heartbeat_clean('upstream_key') }} as upstream_key,
    {{ heartbeat_clean('preprocess_query') }} as preprocess_query,
    {{ heartbeat_clean('trigger_job_id') }} as trigger_job_id,
    {{ heartbeat_clean('trigger_job_name') }} as trigger_job_name,
    coalesce(upper({{ heartbeat_clean('job_state') }}), 'UNPAUSED') as config_job_state,
    {{ heartbeat_is_true('dependency_flag') }} as is_hard
  from {{ ref('heartbeat_sensor_config') }}
),

keyed as (
  select
    config.*,
    {{ heartbeat_source_key('sensor_source', 'sensor_id', 'upstream_key', 'preprocess_query') }} as source_key
  from config
),

{% if is_incremental() %}
previous as (
  select * from {{ this }}
),
{% endif %}

events as {{ heartbeat_build_events() }},

{# Per request token: refused by the jobs API, started, its run id. #}
request_outcomes as {{ heartbeat_request_outcomes('events') }},

last_config_load as (
  select max(event_ts) as loaded_ts from events where event_type = 'CONFIG_LOADED'
),

{#
  Every fact of a job's state is one aggregate of its events (one pass per job, not a window
  per fact). An event's recency is (event_ts, event_id): the latest wins, ties broken by id.
#}
job_events as (
  select
    e.trigger_job_id, e.event_type, e.event_ts, e.message, e.idempotency_token, e.payload, o.job_run_id,
    named_struct('ts', e.event_ts, 'id', e.event_id) as recency,
    {{ heartbeat_in_lifecycle('e', 'o') }} as in_lifecycle,
    {# pause/resume from the CLI override the config until the next config load #}
    e.event_type in ('JOB_PAUSED', 'JOB_RESUMED') and (l.loaded_ts is null or e.event_ts > l.loaded_ts) as overrides
  from events e
  left join request_outcomes o on o.idempotency_token = e.idempotency_token
  cross join last_config_load l
  where e.trigger_job_id is not null
),

jobs as (
  select
    trigger_job_id,
    {#
      the latest lifecycle event: the job's status; a run's end event also carries when the run
      itself ended, as the jobs backend recorded it (payload run_ended_at: a local process's exit, the
      jobs service's end time), NULL where the backend does not know
    #}
    max_by(named_struct('event_type', event_type, 'event_ts', event_ts, 'message', message,
                        'run_ended_at', {{ heartbeat_run_ended_at('payload') }}), recency)
      filter (where in_lifecycle) as lifecycle,
    {# where the job last consumed its sources' data: its latest trigger request or reset #}
    max(event_ts) filter (where in_lifecycle and event_type in ('TRIGGER_REQUESTED', 'RESET')) as consumed_ts,
    {# the run in flight: the latest request (first try, automatic retry, next run of a sequence) and its run #}
    max_by(named_struct('event_ts', event_ts, 'idempotency_token', idempotency_token, 'job_run_id', job_run_id), recency)
      filter (where in_lifecycle and event_type in ({{ heartbeat_request_types() }})) as request,
    {#
      the request a retry re-runs: the one that consumed the data, or in a catch-up sequence
      the run of it now due (NEXT_WINDOW_REQUESTED consumes nothing new)
    #}
    max_by(named_struct('event_ts', event_ts, 'idempotency_token', idempotency_token, 'payload', payload), recency)
      filter (where in_lifecycle and event_type in ('TRIGGER_REQUESTED', 'NEXT_WINDOW_REQUESTED')) as base,
    {# every unsuccessful end counts (a refusal too): a retry's token is new per end, never a refused run's #}
    collect_list(event_ts) filter (where in_lifecycle and event_type in ('FAILED', 'REFUSED')) as failed_ts,
    max_by(named_struct('event_ts', event_ts, 'message', message), recency)
      filter (where event_type = 'TRIGGER_ERROR') as trigger_error,
    max_by(event_type, recency) filter (where overrides) as state_override
  from job_events
  group by trigger_job_id
),

new_data as (
  select source_key, event_id, event_ts, snapshot_ts, window_from, window_to
  from events
  where event_type = 'NEW_DATA'
),

{#
  A row is created by the config load that added it: its time is that CONFIG_LOADED event's, stamped after every
  event its writer had seen (commits, not clocks), never this engine's clock, which another machine's events
  cannot be compared with. Data recorded after the load is pending for the new row; data before it is not.
#}
rows_now as (
  select
    k.*,
    {% if is_incremental() %}
    coalesce(p.row_created_timestamp, l.loaded_ts, current_timestamp()) as row_created_timestamp
    {% else %}
    coalesce(l.loaded_ts, current_timestamp()) as row_created_timestamp
    {% endif %}
  from keyed k
  cross join last_config_load l
  {% if is_incremental() %}
  left join previous p
    on p.sensor_source = k.sensor_source and p.sensor_id = k.sensor_id and p.trigger_job_id = k.trigger_job_id
  {% endif %}
),

{# Each row with its job's facts, and where its job last consumed the row's data. #}
row_jobs as (
  select
    r.*,
    j.lifecycle, j.request, j.base, j.failed_ts, j.trigger_error, j.state_override,
    {{ heartbeat_consumed_after('r.row_created_timestamp', 'j.consumed_ts') }} as consumed_after
  from rows_now r
  left join jobs j on j.trigger_job_id = r.trigger_job_id
),

{#
  Each row once, with the NEW_DATA events of its source: the latest fetch, and those its job has
  not consumed yet. One aggregate per row (its own columns carried as one struct, identical in the
  group), so the rows are read once.
#}
{%- set pending = heartbeat_is_pending('n.event_ts', 'r.consumed_after') %}
row_data as (
  select
    max(struct(r.*)) as r,
    max(n.snapshot_ts) as latest_event_fetched_timestamp,
    count(n.event_id) filter (where {{ pending }}) as pending_events,
    min(n.event_ts) filter (where {{ pending }}) as first_pending_ts,
    {{ heartbeat_pending_ids('collect_list(n.event_id) filter (where ' ~ pending ~ ')') }} as pending_event_ids,
    min_by(n.window_from, n.event_ts) filter (where {{ pending }}) as pending_window_from,
    max_by(n.window_to, n.event_ts) filter (where {{ pending }}) as pending_window_to
  from row_jobs r
  left join new_data n on n.source_key = r.source_key
  group by r.sensor_source, r.sensor_id, r.trigger_job_id
),

rows_with_data as (
  select
    d.r.*, d.latest_event_fetched_timestamp, d.pending_events, d.first_pending_ts, d.pending_event_ids,
    d.pending_window_from, d.pending_window_to
  from row_data d
),

derived as (
  select
    r.sensor_source,
    r.sensor_id,
    r.sensor_read_type,
    r.asset_description,
    r.upstream_key,
    r.preprocess_query,
    r.latest_event_fetched_timestamp,
    r.trigger_job_id,
    r.trigger_job_name,
    {{ heartbeat_row_status('r.lifecycle.event_type', 'r.pending_events') }} as status,
    r.lifecycle.event_type as last_lifecycle_event,
    r.lifecycle.event_ts as lifecycle_ts,
    {# when the job's last run ended: its own end time; the event's (the tick that noticed it, `complete`'s) if unknown #}
    {{ heartbeat_lifecycle_end_ts('r.lifecycle.run_ended_at', 'r.lifecycle.event_ts') }} as lifecycle_end_ts,
    r.first_pending_ts,
    r.request.event_ts as last_trigger_ts,
    case
      when r.state_override = 'JOB_PAUSED' then 'PAUSED'
      when r.state_override = 'JOB_RESUMED' then 'UNPAUSED'
      else r.config_job_state
    end as job_state,
    case when r.is_hard then 'TRUE' else 'FALSE' end as dependency_flag,
    r.is_hard,
    r.source_key,
    r.pending_events,
    r.pending_event_ids,
    r.pending_window_from,
    r.pending_window_to,
    r.request.job_run_id,
    r.request.idempotency_token as last_idempotency_token,
    r.base.idempotency_token as base_idempotency_token,
    r.base.event_ts as base_requested_ts,
    {{ heartbeat_sequence_run('r.base.payload') }} as sequence_run,
    {{ heartbeat_sequence_runs('r.base.payload') }} as sequence_runs,
    {{ heartbeat_sequence_windows('r.base.payload') }} as sequence_windows,
    {# failures since the request a retry re-runs #}
    {{ heartbeat_consecutive_failures('0', 'r.failed_ts', 'r.base.event_ts') }} as consecutive_failures,
    {{ heartbeat_last_error('r.lifecycle.event_type', 'r.lifecycle.message', 'r.lifecycle.event_ts',
                            'r.trigger_error.event_ts', 'r.trigger_error.message') }} as last_error,
    r.row_created_timestamp
  from rows_with_data r
),

active as (
  select
    sensor_source,
    sensor_id,
    sensor_read_type,
    asset_description,
    upstream_key,
    preprocess_query,
    latest_event_fetched_timestamp,
    trigger_job_id,
    trigger_job_name,
    status,
    {{ heartbeat_status_change_ts('status', 'first_pending_ts', 'lifecycle_ts') }} as status_change_timestamp,
    {{ heartbeat_job_start_ts('status', 'last_trigger_ts') }} as job_start_timestamp,
    {# the spec: job_start_timestamp when the job was triggered, job_end_timestamp its completion time #}
    {{ heartbeat_job_end_ts('status', 'last_lifecycle_event', 'lifecycle_end_ts') }} as job_end_timestamp,
    job_state,
    dependency_flag,
    is_hard,
    source_key,
    pending_events,
    pending_event_ids,
    pending_window_from,
    pending_window_to,
    job_run_id,
    last_idempotency_token,
    base_idempotency_token,
    consecutive_failures,
    last_error,
    true as is_active,
    cast(null as timestamp) as retired_timestamp,
    row_created_timestamp,
    current_timestamp() as updated_at,
    {# the job's lifecycle and catch-up sequence, for heartbeat_job_sequences (added last) #}
    last_lifecycle_event,
    base_requested_ts,
    sequence_run,
    sequence_runs,
    sequence_windows
  from derived
)

select * from active

{% if is_incremental() %}
union all

{# Rows no longer in the config keep their history and are marked retired. #}
select
  p.sensor_source,
  p.sensor_id,
  p.sensor_read_type,
  p.asset_description,
  p.upstream_key,
  p.preprocess_query,
  p.latest_event_fetched_timestamp,
  p.trigger_job_id,
  p.trigger_job_name,
  p.status,
  p.status_change_timestamp,
  p.job_start_timestamp,
  p.job_end_timestamp,
  p.job_state,
  p.dependency_flag,
  p.is_hard,
  p.source_key,
  p.pending_events,
  p.pending_event_ids,
  p.pending_window_from,
  p.pending_window_to,
  p.job_run_id,
  p.last_idempotency_token,
  p.base_idempotency_token,
  p.consecutive_failures,
  p.last_error,
  false as is_active,
  coalesce(p.retired_timestamp, current_timestamp()) as retired_timestamp,
  p.row_created_timestamp,
  case when p.is_active then current_timestamp() else p.updated_at end as updated_at,
  {# a retired row is no job's current state #}
  cast(null as string) as last_lifecycle_event,
  cast(null as timestamp) as base_requested_ts,
  cast(null as int) as sequence_run,
  cast(null as int) as sequence_runs,
  cast(null as string) as sequence_windows
from previous p
left anti join keyed k
  on p.sensor_source = k.sensor_source and p.sensor_id = k.sensor_id and p.trigger_job_id = k.trigger_job_id
{% endif %}
