{# Small expressions shared by the models. #}

{# Trimmed text, with blanks as NULL. #}
{% macro heartbeat_clean(column) -%}
  nullif(trim({{ column }}), '')
{%- endmacro %}

{# A config flag as boolean: TRUE/T/1/YES/Y (any case, spaces ignored); blank means TRUE. #}
{% macro heartbeat_is_true(column) -%}
  (coalesce(upper({{ heartbeat_clean(column) }}), 'TRUE') in ('TRUE', 'T', '1', 'YES', 'Y'))
{%- endmacro %}

{#
  One distinct upstream read. Rows that share it are sensed once per tick. A row with
  its own upstream_key or preprocess_query reads the same upstream differently, so it
  gets its own key (a short hash of both).
#}
{% macro heartbeat_source_key(sensor_source, sensor_id, upstream_key, preprocess_query) -%}
  concat(
    {{ sensor_source }}, ':', {{ sensor_id }},
    case
      when {{ upstream_key }} is null and {{ preprocess_query }} is null then ''
      else concat('#', substr(sha2(concat(coalesce({{ upstream_key }}, ''), '|', coalesce({{ preprocess_query }}, '')), 256), 1, 10))
    end
  )
{%- endmacro %}

{#
  Events recorded by the runner, one row per event id (a replayed append, or an event
  caught in both tables by a crash while archiving, is harmless). Copies of an event
  agree on its type, source and job, so partitioning by them too changes nothing but
  lets the engine filter on them before this window, not after it.

  By default the hot log only: what the control table still needs (see
  heartbeat_events_live). `all_history`, or HEARTBEAT_FULL_HISTORY=true in the environment
  of the dbt call (the full-rebuild path, `python -m heartbeat_runner rebuild`), adds the
  archive. The environment is read when a statement runs, never while dbt parses, so the
  rebuild and the everyday build share one saved parse (a var would make dbt parse the
  whole project again on each switch); the archive is named at parse time all the same,
  so both builds have the same dependencies.
#}
{% macro heartbeat_events(all_history=false) -%}
  {%- set archive = source('heartbeat', 'heartbeat_events_archive') -%}
  (
    select * from (
      select e.*, row_number() over (partition by event_id, event_type, source_key, trigger_job_id
                                     order by event_ts) as heartbeat_copy
      from (
        select * from {{ source('heartbeat', 'heartbeat_events') }}
        {%- if all_history or (execute and env_var('HEARTBEAT_FULL_HISTORY', '') == 'true') %}
        union all
        select * from {{ archive }}
        {%- endif %}
      ) e
    ) numbered
    where heartbeat_copy = 1
  )
{%- endmacro %}

{#
  The events a build of heartbeat_control reads: heartbeat_events(), or, when the engine
  asks for it (var heartbeat_stage_events, set by the runner's engine adapter), a cached
  temporary view of them made by the model's pre-hook. Apache Spark inlines a deterministic
  CTE at every reference, so the control model's dozen references to `events` become a
  dozen copies of the window over the log, and the optimizer spends seconds on them; read
  from one cached relation the plan is small (measured: planning 2.6 s -> 0.9 s). The cache is
  filled by the model's query, at its first read (LAZY): a job of its own cost ~0.35 s more a build.
#}
{% macro heartbeat_build_events() -%}
  {%- if var('heartbeat_stage_events', false) -%}
  (select * from heartbeat_events_staged)
  {%- else -%}
  {{ heartbeat_events() }}
  {%- endif -%}
{%- endmacro %}

{% macro heartbeat_stage_events() -%}
  {%- if var('heartbeat_stage_events', false) -%}
  cache lazy table heartbeat_events_staged as select * from {{ heartbeat_events() }} staged
  {%- endif -%}
{%- endmacro %}

{# Drops the cached view (a failed build may have left one behind): before staging and after the build. #}
{% macro heartbeat_unstage_events() -%}
  {%- if var('heartbeat_stage_events', false) -%}
  drop view if exists heartbeat_events_staged
  {%- endif -%}
{%- endmacro %}

{# The latest event of each partition (ties broken by event id), from a CTE or subquery of events. #}
{% macro heartbeat_latest(events_relation, partition_by) -%}
  (
    select * from (
      select r.*, row_number() over (partition by {{ partition_by }} order by event_ts desc, event_id desc) as recency
      from {{ events_relation }} r
    ) ranked
    where recency = 1
  )
{%- endmacro %}

{#
  The event types that request a run of a job (each with its idempotency token): the first
  try, an automatic retry, the next run of a sequence. A request is in flight until its run ends.
#}
{% macro heartbeat_request_types() -%}
  'TRIGGER_REQUESTED', 'RETRY_REQUESTED', 'NEXT_WINDOW_REQUESTED'
{%- endmacro %}

{#
  The event types that end a job's run in its lifecycle: a success (COMPLETED), a failure (FAILED), and a
  refusal (REFUSED: the jobs service would not run it, e.g. the job is disabled or over its budget policy;
  the run never executed). A refusal blocks the job as a failure does, but only an operator's retry asks
  again: no automatic retry. It counts in consecutive_failures, so each retry gets a token of its own.
#}
{% macro heartbeat_run_end_types() -%}
  'COMPLETED', 'FAILED', 'REFUSED'
{%- endmacro %}

{# The row statuses that block a job until a successful run or an operator clears them: FAILED, REFUSED. #}
{% macro heartbeat_blocked_statuses() -%}
  'FAILED', 'REFUSED'
{%- endmacro %}

{#
  Per idempotency token (a relation): when the jobs API last refused the request
  (refused_ts, its latest TRIGGER_ERROR), whether a run started for it (started) and
  that run's id, and when the jobs service skipped that run (skipped_ts, RUN_SKIPPED).
#}
{% macro heartbeat_request_outcomes(events_relation) -%}
  (
    select
      idempotency_token,
      max(case when event_type = 'TRIGGER_ERROR' then event_ts end) as refused_ts,
      max(case when event_type = 'TRIGGERED' then job_run_id end) as job_run_id,
      max(case when event_type = 'TRIGGERED' then 1 else 0 end) = 1 as started,
      max(case when event_type = 'RUN_SKIPPED' then event_ts end) as skipped_ts
    from {{ events_relation }}
    where event_type in ('TRIGGER_ERROR', 'TRIGGERED', 'RUN_SKIPPED') and idempotency_token is not null
    group by idempotency_token
  )
{%- endmacro %}

{#
  Whether event `e` counts in its job's lifecycle, given `o`, the outcome of its token
  (heartbeat_request_outcomes, left joined): trigger requests of every kind, the run ends
  (heartbeat_run_end_types), RESET. A request the jobs API refused (a TRIGGER_ERROR with its token after it)
  never happened, unless an attempt with the same token did start a run (the job was fixed
  and the retry of the same request went through). A request whose run the jobs service
  skipped (a RUN_SKIPPED with its token: the run never executed) never happened either: the
  data it consumed is pending again, and the runner asks again with a new token.
#}
{% macro heartbeat_in_lifecycle(e, o) -%}
  ({{ e }}.event_type in ({{ heartbeat_request_types() }}, {{ heartbeat_run_end_types() }}, 'RESET')
   and not coalesce({{ e }}.event_type in ({{ heartbeat_request_types() }})
                    and (({{ o }}.refused_ts > {{ e }}.event_ts and not {{ o }}.started)
                         or {{ o }}.skipped_ts > {{ e }}.event_ts), false))
{%- endmacro %}

{# The job lifecycle events that count (a relation of events): see heartbeat_in_lifecycle. #}
{% macro heartbeat_lifecycle(events_relation) -%}
  (
    select e.*
    from {{ events_relation }} e
    left join {{ heartbeat_request_outcomes(events_relation) }} o on o.idempotency_token = e.idempotency_token
    where {{ heartbeat_in_lifecycle('e', 'o') }}
  )
{%- endmacro %}

{# The events that set a source's cursor: NEW_DATA, CURSOR and RESET (of a source). #}
{% macro heartbeat_cursor_events(all_history=false) -%}
  (select * from {{ heartbeat_events(all_history) }} e
   where event_type in ('NEW_DATA', 'CURSOR', 'RESET') and source_key is not null)
{%- endmacro %}

{# The cursor each source has reached: its latest cursor event. #}
{% macro heartbeat_latest_cursors() -%}
  {{ heartbeat_latest(heartbeat_cursor_events(), 'source_key') }}
{%- endmacro %}

{# The latest evaluation of each source in the run report (its outcome and error), one row per source. #}
{% macro heartbeat_last_evaluations() -%}
  (
    select * from (
      select
        source_key, run_id, snapshot_ts, outcome, error,
        row_number() over (partition by source_key order by snapshot_ts desc) as recency
      from {{ source('heartbeat', 'heartbeat_run_report') }}
    ) ranked
    where recency = 1
  )
{%- endmacro %}

{#
  Why a control row does not ask for its source to be sensed, or NULL when it does
  (the row is eligible: job UNPAUSED, status NULL or COMPLETED).
#}
{% macro heartbeat_not_sensed_reason(windowed='false') -%}
  case
    when job_state <> 'UNPAUSED' then 'paused'
    when status = 'IN_PROGRESS' then 'in progress'
    when status = 'FAILED' then 'failed, waits for a successful run'
    when status = 'REFUSED' then 'refused by the jobs service, waits for a retry'
    {# a job with an event-time window policy keeps sensing: its watermarks must move #}
    when status = 'NEW_EVENT_AVAILABLE' and not ({{ windowed }}) then 'new data waiting to trigger'
  end
{%- endmacro %}

{#
  ", catch-up run 3 of 7, window [...]" for a job in a bounded catch-up sequence (alias of a
  heartbeat_job_sequences row, joined on the job), else ''.
#}
{% macro heartbeat_sequence_note(alias) -%}
  coalesce(concat(', catch-up run ', cast({{ alias }}.run as string), ' of ', cast({{ alias }}.runs as string),
                  ', windows ', {{ alias }}.windows), '')
{%- endmacro %}
