{#
  The data product's sensor state table (the shape other products sense with the
  `delta_upstream_sensor_table` source): one row per distinct source this heartbeat
  senses, with the cursor it reached.

    ACQUIRED_NEW_DATA   new data was sensed and some job fed by it has not finished
                        processing it (NEW_EVENT_AVAILABLE, IN_PROGRESS, FAILED or REFUSED)
    PROCESSED_NEW_DATA  every job fed by it completed after the data arrived, and nothing
                        new was sensed since: a job running again on other sources' data
                        (this one a soft dependency) leaves it processed

  status_change_timestamp is when the row's status last changed: a build that keeps a row's
  status keeps its timestamp (a job triggering or finishing while its source stays
  ACQUIRED_NEW_DATA moves nothing a follower senses by).

  Updated in place (MERGE on sensor_id, rows that changed only; sources no longer selected
  are deleted), so the table keeps its id and history: a follower can read it by version
  and, where the engine writes one (var heartbeat_change_feed), by its change data feed.

  The rows are macros/heartbeat_sensor_state.sql's: the runner refreshes this table in a tick
  with the same rows and the same MERGE, run without a dbt command (heartbeat_merge_sensor_state).
#}
{%- set state_columns = heartbeat_sensor_state_columns() -%}
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

{{ heartbeat_sensor_state_rows(this if is_incremental() else none) }}
