{#
  The sensor state table's rows (models/heartbeat_sensor_state.sql), and the MERGE that brings the table to
  them, which the runner runs itself in a tick (lakehouse/control_table.py; rendered once by dbt) rather
  than start a dbt command: the same statement dbt's incremental build makes of the model (its unique key,
  `matched_condition` and `not_matched_by_source_action`, see spark__get_merge_sql), so either leaves the
  same table. tests/test_fold.py compares them.
#}

{# The columns a row can change in; a MERGE rewrites a matched row only when one of them changed. #}
{% macro heartbeat_sensor_state_columns() -%}
  {{ return(['assets', 'status', 'status_change_timestamp', 'checkpoint_location', 'upstream_key',
             'upstream_value', 'sensor_source', 'latest_event_fetched_timestamp']) }}
{%- endmacro %}

{#
  One row per sensed source; `previous` is the table as it is (none: a first build). `changed` (a relation
  of source_key and trigger_job_id, one of them set per row), when given, limits the rows to the sources it
  names and the sources of the jobs it names: what a tick's folds changed.
#}
{% macro heartbeat_sensor_state_rows(previous, changed=none) -%}
with
{%- if changed is not none %}
changed_sources as (
  select source_key from {{ changed }} where source_key is not null
  union
  select c.source_key from {{ ref('heartbeat_control') }} c join {{ changed }} j on j.trigger_job_id = c.trigger_job_id
),
{%- endif %}

rows_by_source as (
  select
    source_key,
    max(sensor_source) as sensor_source,
    max(upstream_key) as upstream_key,
    {# what another product can follow this source by: the object it reads and its descriptions #}
    sort_array(array_distinct(concat(collect_set(sensor_id), collect_set(asset_description)))) as assets,
    sum(case when status = 'NEW_EVENT_AVAILABLE' then 1 else 0 end) as waiting_rows,
    sum(case when status in ('IN_PROGRESS', {{ heartbeat_blocked_statuses() }}) then 1 else 0 end) as running_rows,
    sum(case when status = 'COMPLETED' then 1 else 0 end) as completed_rows,
    max(status_change_timestamp) as status_change_timestamp,
    max(latest_event_fetched_timestamp) as latest_event_fetched_timestamp
  from {{ ref('heartbeat_control') }}
  where is_active
  {%- if changed is not none %} and source_key in (select source_key from changed_sources){% endif %}
  group by source_key
),

{%- if changed is not none %}
changed_cursor_events as (
  select * from {{ heartbeat_cursor_events() }} e where e.source_key in (select source_key from changed_sources)
),

cursors as {{ heartbeat_latest('changed_cursor_events', 'source_key') }},
{%- else %}

cursors as {{ heartbeat_latest_cursors() }},
{%- endif %}

{# the rows as the last build left them: none at a first build or a full refresh #}
previous as (
  {% if previous is not none %}
  select sensor_id, status, status_change_timestamp from {{ previous }}
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
{%- endmacro %}

{#
  `changed` (see heartbeat_sensor_state_rows), when given, brings only the rows of the sources a tick's folds
  changed, and deletes none (a source leaves the table only by a config load, which dbt builds).
#}
{% macro heartbeat_merge_sensor_state(changed=none) -%}
{%- set columns = ['sensor_id'] + heartbeat_sensor_state_columns() -%}
{%- set target = ref('heartbeat_sensor_state') -%}
merge into {{ target }} as DBT_INTERNAL_DEST
using (
{{ heartbeat_sensor_state_rows(target, changed) }}
) as DBT_INTERNAL_SOURCE
on DBT_INTERNAL_SOURCE.sensor_id = DBT_INTERNAL_DEST.sensor_id
when matched and ({{ heartbeat_any_column_changed(heartbeat_sensor_state_columns()) }}) then update set
  {% for c in columns %}{{ c }} = DBT_INTERNAL_SOURCE.{{ c }}{{ ', ' if not loop.last }}{% endfor %}
when not matched then insert ({{ columns | join(', ') }})
  values ({% for c in columns %}DBT_INTERNAL_SOURCE.{{ c }}{{ ', ' if not loop.last }}{% endfor %})
{%- if changed is none %}
when not matched by source then delete
{%- endif %}
{%- endmacro %}
