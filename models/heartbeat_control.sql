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
    NEW_EVENT_AVAILABLE  new data was sensed for this row's source after the job last
                         consumed it (its latest trigger, reset, or the row's creation)
    COMPLETED            the job's latest lifecycle event is a success
    NULL                 nothing happened yet (new row) or the job was reset

  Rows removed from the config are retired (is_active = false), never deleted.
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

trigger_errors as (
  select * from events where event_type = 'TRIGGER_ERROR'
),

lifecycle as {{ heartbeat_lifecycle('events') }},

latest_lifecycle as {{ heartbeat_latest('lifecycle', 'trigger_job_id') }},

{# Where each job last consumed its sources' data: its latest trigger request or reset. #}
consumed_until as (
  select trigger_job_id, max(event_ts) as consumed_ts
  from lifecycle
  where event_type in ('TRIGGER_REQUESTED', 'RESET')
  group by trigger_job_id
),

{# The run in flight: the latest request: first try, automatic retry, or the next run of a sequence. #}
trigger_requests as (
  select * from lifecycle where event_type in ({{ heartbeat_request_types() }})
),

latest_trigger as {{ heartbeat_latest('trigger_requests', 'trigger_job_id') }},

{#
  The request a retry re-runs, and how often it failed since: the one that consumed the data,
  or in a catch-up sequence the run of it now due (NEXT_WINDOW_REQUESTED consumes nothing new).
#}
base_requests as (
  select * from lifecycle where event_type in ('TRIGGER_REQUESTED', 'NEXT_WINDOW_REQUESTED')
),

latest_base as {{ heartbeat_latest('base_requests', 'trigger_job_id') }},

failures_since_base as (
  select f.trigger_job_id, count(*) as failures
  from lifecycle f
  join latest_base b on b.trigger_job_id = f.trigger_job_id and f.event_ts > b.event_ts
  where f.event_type = 'FAILED'
  group by f.trigger_job_id
),

triggered_runs as (
  select idempotency_token, max(job_run_id) as job_run_id, max(event_ts) as triggered_ts
  from events
  where event_type = 'TRIGGERED'
  group by idempotency_token
),

last_trigger_error as {{ heartbeat_latest('trigger_errors', 'trigger_job_id') }},

{# pause/resume from the CLI override the config until the next config load. #}
last_config_load as (
  select max(event_ts) as loaded_ts from events where event_type = 'CONFIG_LOADED'
),

pause_events as (
  select e.*
  from events e
  cross join last_config_load l
  where e.event_type in ('JOB_PAUSED', 'JOB_RESUMED')
    and (l.loaded_ts is null or e.event_ts > l.loaded_ts)
),

state_override as {{ heartbeat_latest('pause_events', 'trigger_job_id') }},

new_data as (
  select source_key, event_id, event_ts, snapshot_ts, window_from, window_to
  from events
  where event_type = 'NEW_DATA'
),

latest_fetch as (
  select source_key, max(snapshot_ts) as latest_event_fetched_timestamp
  from new_data
  group by source_key
),

rows_now as (
  select
    k.*,
    {% if is_incremental() %}
    coalesce(p.row_created_timestamp, current_timestamp()) as row_created_timestamp
    {% else %}
    current_timestamp() as row_created_timestamp
    {% endif %}
  from keyed k
  {% if is_incremental() %}
  left join previous p
    on p.sensor_source = k.sensor_source and p.sensor_id = k.sensor_id and p.trigger_job_id = k.trigger_job_id
  {% endif %}
),

{# NEW_DATA events of a row's source that its job has not consumed yet. #}
pending as (
  select
    r.sensor_source, r.sensor_id, r.trigger_job_id,
    count(*) as pending_events,
    min(n.event_ts) as first_pending_ts,
    concat_ws(',', sort_array(collect_list(n.event_id))) as pending_event_ids,
    min_by(n.window_from, n.event_ts) as pending_window_from,
    max_by(n.window_to, n.event_ts) as pending_window_to
  from rows_now r
  join new_data n on n.source_key = r.source_key
  left join consumed_until c on c.trigger_job_id = r.trigger_job_id
  where n.event_ts > greatest(r.row_created_timestamp, coalesce(c.consumed_ts, r.row_created_timestamp))
  group by r.sensor_source, r.sensor_id, r.trigger_job_id
),

derived as (
  select
    r.sensor_source,
    r.sensor_id,
    r.sensor_read_type,
    r.asset_description,
    r.upstream_key,
    r.preprocess_query,
    f.latest_event_fetched_timestamp,
    r.trigger_job_id,
    r.trigger_job_name,
    case
      when l.event_type in ({{ heartbeat_request_types() }}) then 'IN_PROGRESS'
      when l.event_type = 'FAILED' then 'FAILED'
      when p.pending_events > 0 then 'NEW_EVENT_AVAILABLE'
      when l.event_type = 'COMPLETED' then 'COMPLETED'
      else cast(null as string)
    end as status,
    l.event_type as last_lifecycle_event,
    l.event_ts as lifecycle_ts,
    p.first_pending_ts,
    t.event_ts as last_trigger_ts,
    case
      when s.event_type = 'JOB_PAUSED' then 'PAUSED'
      when s.event_type = 'JOB_RESUMED' then 'UNPAUSED'
      else r.config_job_state
    end as job_state,
    case when r.is_hard then 'TRUE' else 'FALSE' end as dependency_flag,
    r.is_hard,
    r.source_key,
    coalesce(p.pending_events, 0) as pending_events,
    p.pending_event_ids,
    p.pending_window_from,
    p.pending_window_to,
    tr.job_run_id,
    t.idempotency_token as last_idempotency_token,
    b.idempotency_token as base_idempotency_token,
    b.event_ts as base_requested_ts,
    cast(get_json_object(b.payload, '$._run') as int) as sequence_run,
    cast(get_json_object(b.payload, '$._runs') as int) as sequence_runs,
    get_json_object(b.payload, '$.heartbeat_windows') as sequence_windows,
    coalesce(fs.failures, 0) as consecutive_failures,
    case
      when l.event_type = 'FAILED' then l.message
      when e.event_ts > coalesce(l.event_ts, timestamp '1900-01-01') then e.message
    end as last_error,
    r.row_created_timestamp
  from rows_now r
  left join latest_lifecycle l on l.trigger_job_id = r.trigger_job_id
  left join latest_trigger t on t.trigger_job_id = r.trigger_job_id
  left join triggered_runs tr on tr.idempotency_token = t.idempotency_token
  left join latest_base b on b.trigger_job_id = r.trigger_job_id
  left join failures_since_base fs on fs.trigger_job_id = r.trigger_job_id
  left join pending p
    on p.sensor_source = r.sensor_source and p.sensor_id = r.sensor_id and p.trigger_job_id = r.trigger_job_id
  left join latest_fetch f on f.source_key = r.source_key
  left join state_override s on s.trigger_job_id = r.trigger_job_id
  left join last_trigger_error e on e.trigger_job_id = r.trigger_job_id
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
    case
      when status = 'NEW_EVENT_AVAILABLE' then first_pending_ts
      when status is not null then lifecycle_ts
    end as status_change_timestamp,
    case when status in ('IN_PROGRESS', 'COMPLETED', 'FAILED') then last_trigger_ts end as job_start_timestamp,
    case when status in ('COMPLETED', 'FAILED') and last_lifecycle_event in ('COMPLETED', 'FAILED') then lifecycle_ts end
      as job_end_timestamp,
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
