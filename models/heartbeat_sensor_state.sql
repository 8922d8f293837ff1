{#
  The data product's sensor state table (the shape other products sense with the
  `delta_upstream_sensor_table` source): one row per distinct source this heartbeat
  senses, with the cursor it reached.

    ACQUIRED_NEW_DATA   new data was sensed and some job fed by it has not finished
                        processing it (NEW_EVENT_AVAILABLE, IN_PROGRESS or FAILED)
    PROCESSED_NEW_DATA  every job fed by it completed after the data arrived, and nothing
                        new was sensed since: a job running again on other sources' data
                        (this one a soft dependency) leaves it processed

  status_change_timestamp is when the row's status last changed: a build that keeps a row's
  status keeps its timestamp (a job triggering or finishing while its source stays
  ACQUIRED_NEW_DATA moves nothing a follower senses by).

  Updated in place (MERGE on sensor_id, rows that changed only; sources no longer selected
  are deleted), so the table keeps its id and history: a follower can read it by version
  and, where the engine writes one (var heartbeat_change_feed), by its change data feed.
#}
{%- set state_columns = ['assets', 'status', 'status_change_timestamp', 'checkpoint_location', 'upstream_key',
                         'upstream_value', 'sensor_source', 'latest_event_fetched_timestamp'] -%}
{{
  config(
    materialized='incremental',
    incremental_strategy='merge',
    unique_key='sensor_id',
    matched_condition=heartbeat_any_column_changed(state_columns),
    not_matched_by_source_action='delete',
  )
}}
{#- only where the engine writes a change feed: dbt-databricks cannot render an absent (none) tblproperties -#}
{%- if var('heartbeat_change_feed', false) %}{{ config(tblproperties={'delta.enableChangeDataFeed': 'true'}) }}{% endif %}

with rows_by_source as (
  select
    source_key,
    max(sensor_source) as sensor_source,
    max(upstream_key) as upstream_key,
    {# what another product can follow this source by: the object it reads and its descriptions #}
    sort_array(array_distinct(concat(collect_set(sensor_id), collect_set(asset_description)))) as assets,
    sum(case when status = 'NEW_EVENT_AVAILABLE' then 1 else 0 end) as waiting_rows,
    sum(case when status in ('IN_PROGRESS', 'FAILED') then 1 else 0 end) as running_rows,
    sum(case when status = 'COMPLETED' then 1 else 0 end) as completed_rows,
    max(status_change_timestamp) as status_change_timestamp,
    max(latest_event_fetched_timestamp) as latest_event_fetched_timestamp
  from {{ ref('heartbeat_control') }}
  where is_active
  group by source_key
),

cursors as {{ heartbeat_latest_cursors() }},

{# the rows as the last build left them: none at a first build or a full refresh #}
previous as (
  {% if is_incremental() %}
  select sensor_id, status, status_change_timestamp from {{ this }}
  {% else %}
  select cast(null as string) as sensor_id, cast(null as string) as status,
    cast(null as string) as status_change_timestamp
  where false
  {% endif %}
),

{#
  A job running (or failed) is processing this source's data unless the source was already
  processed and nothing was fetched from it since: every fetch a build saw when it declared the
  source processed had been consumed, and a later fetch is dated after that build.
#}
states as (
  select
    r.*,
    case
      when r.waiting_rows > 0 then 'ACQUIRED_NEW_DATA'
      when r.running_rows > 0 and p.status = 'PROCESSED_NEW_DATA'
        and r.latest_event_fetched_timestamp <= cast(p.status_change_timestamp as timestamp) then 'PROCESSED_NEW_DATA'
      when r.running_rows > 0 then 'ACQUIRED_NEW_DATA'
      when r.completed_rows > 0 then 'PROCESSED_NEW_DATA'
    end as status,
    p.sensor_id as previous_sensor_id,
    p.status as previous_status,
    p.status_change_timestamp as previous_status_change_timestamp
  from rows_by_source r
  left join previous p on p.sensor_id = r.source_key
)

select
  r.source_key as sensor_id,
  r.assets,
  r.status,
  {# the status it had: unchanged, so is its timestamp; changed, when the latest of its rows changed #}
  case
    when r.previous_sensor_id is not null and r.previous_status <=> r.status then r.previous_status_change_timestamp
    else cast(r.status_change_timestamp as string)
  end as status_change_timestamp,
  cast(null as string) as checkpoint_location,
  r.upstream_key,
  c.cursor_to as upstream_value,
  r.sensor_source,
  r.latest_event_fetched_timestamp
from states r
left join cursors c on c.source_key = r.source_key
where r.latest_event_fetched_timestamp is not null
