{#
  Engine specifics, dispatched by adapter (dbt looks for spark__ / databricks__ first).

  On the embedded engine every table needs a fixed location: the catalog is in
  memory and empty at every start, so the runner re-registers the Delta folders.
  On Databricks HEARTBEAT_LOCATION_ROOT stays empty and tables are managed.

  The runner's per-lakehouse paths (HEARTBEAT_LOCATION_ROOT, HEARTBEAT_MERGE_STAGE_ROOT,
  HEARTBEAT_SEED_FILE) are read from the environment when a statement runs, never at parse
  time: dbt's saved parse of the project then fits every lakehouse (lakehouse/dbt_invoke.py).
#}
{% macro spark__location_clause() %}
  {%- set root = env_var('HEARTBEAT_LOCATION_ROOT', '') -%}
  {%- if root %}
    location '{{ root }}/{{ model['alias'] }}'
  {%- else -%}
    {%- set location_root = config.get('location_root', validator=validation.any[basestring]) -%}
    {%- if location_root is not none %}
    location '{{ location_root }}/{{ model['alias'] }}'
    {%- endif %}
  {%- endif %}
{%- endmacro -%}

{#
  A MERGE runs its source query more than once: Sail three times for the control model
  (whose source reads the whole event history), local Apache Spark twice (finding the
  touched files, then writing). Where the runner sets HEARTBEAT_MERGE_STAGE_ROOT (engines
  on this machine's disk) an incremental model's source is therefore computed once, into
  parquet files under <stage root>/<invocation id>/, and the temporary view the MERGE
  reads selects from them; the runner deletes them after its own dbt commands, and
  those of plain dbt runs (`serve`) once they are an hour old. The anchor row
  keeps an empty result readable (an empty directory has no schema). The view keeps the
  files' marker column: the MERGE (spark__get_merge_sql) names the target's columns, so
  no statement asks for the source's (asking cost 0.2-0.3 s a build on Spark).
#}
{% macro spark__create_temporary_view(relation, compiled_code) -%}
  {%- set root = env_var('HEARTBEAT_MERGE_STAGE_ROOT', '') -%}
  {%- if root and config.get('materialized') == 'incremental' -%}
    {%- set location = root ~ '/' ~ invocation_id ~ '/' ~ relation.identifier -%}
    {% call statement('stage_merge_source') -%}
      insert overwrite directory '{{ location }}' using parquet
      select staged.* from (select 1 as anchor) a
      left join (select q.*, true as heartbeat_staged_row from ({{ compiled_code }}) q) staged on true
    {%- endcall %}
    create or replace temporary view {{ relation }} as
      select * from parquet.`{{ location }}` where heartbeat_staged_row
  {%- else -%}
    create or replace temporary view {{ relation }} as
      {{ compiled_code }}
  {%- endif -%}
{%- endmacro %}

{#
  dbt fills its relation cache at the start of every invocation. dbt-spark asks with SHOW TABLE
  EXTENDED, which reads every table's full metadata from the metastore: 0.4-0.55 s on local
  Apache Spark, twice in a tick that triggers. dbt needs only each relation's name, whether it
  is a view, and whether it is Delta. Where the runner sets `heartbeat_list_by_name` (local
  Apache Spark, where every table of Heartbeat's schema is Delta: the project's file format and
  spark.sql.sources.default) two name listings answer that (~0.05 s each). Elsewhere dbt-spark's
  own listing runs.
#}
{% macro spark__list_relations_without_caching(relation) %}
  {%- if var('heartbeat_list_by_name', false) -%}
    {%- call statement('heartbeat_list_tables', fetch_result=True) -%}
      show tables in {{ relation.schema }}
    {%- endcall -%}
    {%- call statement('heartbeat_list_views', fetch_result=True) -%}
      show views in {{ relation.schema }}
    {%- endcall -%}
    {%- set views = load_result('heartbeat_list_views').table.columns[1].values() | list -%}
    {#- the four fields of a SHOW TABLE EXTENDED row: schema, name, temporary, information -#}
    {%- set rows = [] -%}
    {%- for row in load_result('heartbeat_list_tables').table.rows -%}
      {%- do rows.append([row[0], row[1], row[2],
                          'Type: VIEW' if row[1] in views else 'Type: MANAGED, Provider: delta']) -%}
    {%- endfor -%}
    {{ return(rows) }}
  {%- else -%}
    {{ return(dbt.spark__list_relations_without_caching(relation)) }}
  {%- endif -%}
{% endmacro %}

{#
  dbt-spark re-seeds with DROP then CREATE; on the embedded engine DROP keeps the
  Delta files, so rows would duplicate. CREATE OR REPLACE starts a new version instead.
#}
{% macro spark__create_csv_table(model, agate_table) %}
  {%- set column_override = model['config'].get('column_types', {}) -%}
  {%- set quote_seed_column = model['config'].get('quote_columns', None) -%}
  {% set sql %}
    create or replace table {{ this.render() }} (
        {%- for col_name in agate_table.column_names -%}
            {%- set inferred_type = adapter.convert_type(agate_table, loop.index0) -%}
            {%- set type = column_override.get(col_name, inferred_type) -%}
            {{ adapter.quote_seed_column(col_name | string, quote_seed_column) }} {{ type }} {%- if not loop.last -%}, {%- endif -%}
        {%- endfor -%}
    )
    {{ file_format_clause() }}
    {{ location_clause() }}
  {% endset %}
  {% call statement('_') -%}
    {{ sql }}
  {%- endcall %}
  {{ return(sql) }}
{% endmacro %}

{% macro spark__reset_csv_table(model, full_refresh, old_relation, agate_table) %}
  {{ return(create_csv_table(model, agate_table)) }}
{% endmacro %}

{#
  dbt-spark's session method renders seed bindings as '{value}': NULL becomes the
  string 'None' and a quote inside a value (a preprocess_query with a string
  literal) breaks the statement. Render escaped literals ourselves instead.
#}
{% macro spark__load_csv_rows(model, agate_table) %}
  {%- set seed_file = env_var('HEARTBEAT_SEED_FILE', '') -%}
  {%- if seed_file -%}
    {{ return(heartbeat_load_csv_file(model, agate_table, seed_file)) }}
  {%- endif -%}
  {% set batch_size = get_batch_size() %}
  {% set column_override = model['config'].get('column_types', {}) %}
  {% set statements = [] %}
  {% for chunk in agate_table.rows | batch(batch_size) %}
    {% set sql %}
      insert into {{ this.render() }} values
      {% for row in chunk -%}
        ({%- for col_name in agate_table.column_names -%}
          {%- set inferred_type = adapter.convert_type(agate_table, loop.index0) -%}
          {%- set type = column_override.get(col_name, inferred_type) -%}
          cast({{ heartbeat_sql_literal(row[loop.index0]) }} as {{ type }})
          {%- if not loop.last %},{% endif -%}
        {%- endfor -%})
        {%- if not loop.last %},{% endif %}
      {% endfor %}
    {% endset %}
    {% do adapter.add_query(sql, abridge_sql_log=True) %}
    {% if loop.index0 == 0 %}
      {% do statements.append(sql) %}
    {% endif %}
  {% endfor %}
  {{ return(statements[0] if statements else '') }}
{% endmacro %}

{#
  Where the engine runs on this machine (the runner sets HEARTBEAT_SEED_FILE to the seed's path: the
  embedded engine, local Apache Spark), the engine reads the seed's CSV file itself rather than an INSERT
  of every row as literals (10,000 rows: ~13 s, the text built here and then parsed by the engine; the
  file read: well under a second). Every field is read as text (RFC 4180: quotes, doubled quotes, line
  breaks inside quotes) and cast as the table declares; an empty field, or one that says null, is NULL, as
  agate (dbt's CSV reader) reads it.
#}
{% macro heartbeat_load_csv_file(model, agate_table, seed_file) %}
  {%- set column_override = model['config'].get('column_types', {}) -%}
  {% call statement('heartbeat_seed_rows') -%}
    create or replace temporary view heartbeat_seed_rows using csv
    options (path {{ heartbeat_sql_literal(seed_file) }}, header 'true', multiLine 'true', quote '"',
             escape '"', mode 'FAILFAST')
  {%- endcall %}
  {% set sql %}
    insert into {{ this.render() }}
    select
      {% for col_name in agate_table.column_names -%}
        {%- set type = column_override.get(col_name, adapter.convert_type(agate_table, loop.index0)) -%}
        cast(case when lower(trim(`{{ col_name }}`)) in ('', 'null') then null else `{{ col_name }}` end as {{ type }})
        {%- if not loop.last %},{% endif %}
      {% endfor %}
    from heartbeat_seed_rows
  {% endset %}
  {% do adapter.add_query(sql, abridge_sql_log=True) %}
  {{ return(sql) }}
{% endmacro %}

{% macro heartbeat_sql_literal(value) -%}
  {%- if value is none -%}
    null
  {%- else -%}
    '{{ value | string | replace("\\", "\\\\") | replace("'", "\\'") }}'
  {%- endif -%}
{%- endmacro %}

{#
  dbt resolves `dbt` dispatch in the root project first, so the spark__ overrides above
  would also win over dbt-databricks' own seed macros. On Databricks use the adapter's.
#}
{% macro databricks__create_csv_table(model, agate_table) %}
  {{ return(dbt.databricks__create_csv_table(model, agate_table)) }}
{% endmacro %}

{% macro databricks__reset_csv_table(model, full_refresh, old_relation, agate_table) %}
  {{ return(dbt.databricks__reset_csv_table(model, full_refresh, old_relation, agate_table)) }}
{% endmacro %}

{% macro databricks__load_csv_rows(model, agate_table) %}
  {{ return(dbt.databricks__load_csv_rows(model, agate_table)) }}
{% endmacro %}

{#
  dbt-spark's MERGE, plus two options dbt-databricks offers under the same names, so that
  a model reads alike on every engine: `matched_condition` (update a matched row only when
  it holds, e.g. when a column changed: the table's change data feed then records real
  changes only) and `not_matched_by_source_action='delete'` (rows the model no longer
  selects leave the table). Without them it is dbt-spark's MERGE.
#}
{% macro spark__get_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) %}
  {%- set predicates = [] if incremental_predicates is none else [] + incremental_predicates -%}
  {%- set keys = [unique_key] if unique_key is string else (unique_key or []) -%}
  {%- for key in keys %}
    {%- do predicates.append('DBT_INTERNAL_SOURCE.' ~ key ~ ' = DBT_INTERNAL_DEST.' ~ key) -%}
  {%- endfor %}
  {%- if not keys %}{% do predicates.append('FALSE') %}{% endif -%}
  {%- set dest_columns = adapter.get_columns_in_relation(target) -%}
  {%- set update_columns = get_merge_update_columns(config.get('merge_update_columns'),
                                                    config.get('merge_exclude_columns'), dest_columns) -%}
  {%- set insert_columns = dest_columns | map(attribute='quoted') | list -%}
  {%- if not insert_columns -%}
    {#- the embedded engine's catalog may know a table's location but not its columns: the source's then -#}
    {%- for name in get_columns_in_query('select * from ' ~ source) if name != 'heartbeat_staged_row' -%}
      {%- do insert_columns.append('`' ~ name ~ '`') -%}
    {%- endfor -%}
    {%- set update_columns = insert_columns -%}
  {%- endif -%}
  {%- set matched_condition = config.get('matched_condition') -%}
  merge into {{ target }} as DBT_INTERNAL_DEST
      using {{ source }} as DBT_INTERNAL_SOURCE
      on {{ predicates | join(' and ') }}
      when matched {%- if matched_condition %} and ({{ matched_condition }}){% endif %} then update set
        {% if update_columns -%}{%- for column_name in update_columns %}
            {{ column_name }} = DBT_INTERNAL_SOURCE.{{ column_name }}{{ ', ' if not loop.last }}
        {%- endfor %}{%- else %} * {% endif %}
      {#- the target's columns by name: a staged source also has its marker column #}
      when not matched then insert ({{ insert_columns | join(', ') }})
        values ({% for c in insert_columns %}DBT_INTERNAL_SOURCE.{{ c }}{{ ', ' if not loop.last }}{% endfor %})
      {%- if config.get('not_matched_by_source_action') == 'delete' %}
      when not matched by source then delete
      {%- endif %}
{% endmacro %}

{# `not (s.c <=> d.c and ...)` over ``columns``: a matched row differs in one of them. #}
{% macro heartbeat_any_column_changed(columns) -%}
  not ({% for c in columns %}DBT_INTERNAL_SOURCE.{{ c }} <=> DBT_INTERNAL_DEST.{{ c }}{{ ' and ' if not loop.last }}{% endfor %})
{%- endmacro %}
