{#
  The data product's sensor state table (the shape other products sense with the
  `delta_upstream_sensor_table` source): one row per distinct source this heartbeat
  senses, with the cursor it reached.

    ACQUIRED_NEW_DATA   new data was sensed and some job fed by it has not finished
                        processing it (NEW_EVENT_AVAILABLE, IN_PROGRESS or FAILED)
    PROCESSED_NEW_DATA  every job fed by it completed after the data arrived

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
    sum(case when status in ('NEW_EVENT_AVAILABLE', 'IN_PROGRESS', 'FAILED') then 1 else 0 end) as unprocessed_rows,
    sum(case when status = 'COMPLETED' then 1 else 0 end) as completed_rows,
    max(status_change_timestamp) as status_change_timestamp,
    max(latest_event_fetched_timestamp) as latest_event_fetched_timestamp
  from {{ ref('heartbeat_control') }}
  where is_active
  group by source_key
),

cursors as {{ heartbeat_latest_cursors() }}

select
  r.source_key as sensor_id,
  r.assets,
  case
    when r.unprocessed_rows > 0 then 'ACQUIRED_NEW_DATA'
    when r.completed_rows > 0 then 'PROCESSED_NEW_DATA'
  end as status,
  cast(r.status_change_timestamp as string) as status_change_timestamp,
  cast(null as string) as checkpoint_location,
  r.upstream_key,
  c.cursor_to as upstream_value,
  r.sensor_source,
  r.latest_event_fetched_timestamp
from rows_by_source r
left join cursors c on c.source_key = r.source_key
where r.latest_event_fetched_timestamp is not null
