{#
  The per-row rules of the control table, each written once (issue 54, "one derivation").

  models/heartbeat_control.sql derives every row from all the events and calls these macros on what it
  aggregated; the folds of macros/heartbeat_folds.sql bring a built row up to date with one commit and call
  the same macros on the new inputs they compute (the new lifecycle event, the new pending count, ...). A
  rule is therefore never restated: a change to one changes the derivation and every fold alike.
  tests/test_row_rules.py checks that both sides call them (and that no fold assigns a ruled column by
  itself); tests/test_fold.py compares folded tables with derived ones.

  Every argument is a SQL expression (a column or an expression of the caller's relations), rendered in
  place: a macro pastes no value, only the caller's names.

  Invariants a built active row keeps (models/heartbeat_control.sql writes them; each fold writes them
  through these rules, so they hold after it too):
    status                  = heartbeat_row_status(last_lifecycle_event, pending_events)
    status_change_timestamp = heartbeat_status_change_ts(status, <first pending event's time>, <lifecycle event's time>)
    job_start_timestamp     = heartbeat_job_start_ts(status, <latest request's time>)
    job_end_timestamp       = heartbeat_job_end_ts(status, last_lifecycle_event, <its run's end>)
  so a fold can read back the times a row keeps only inside its status columns
  (heartbeat_built_lifecycle_ts, heartbeat_built_first_pending_ts).
#}

{#
  A row's status, from its job's latest lifecycle event (heartbeat_in_lifecycle; NULL: none) and how many
  NEW_DATA events of its source are pending for it: the job's lifecycle first, then the row's own data.
    IN_PROGRESS          the latest lifecycle event is an effective trigger request
    FAILED               it is a failure (blocks the job until a successful run is recorded)
    REFUSED              it is a refusal: the jobs service would not run the job (blocks it until an
                         operator's retry, or a successful run, is recorded)
    NEW_EVENT_AVAILABLE  data is pending (sensed after the job last consumed it)
    COMPLETED            it is a success
    NULL                 nothing happened yet (new row) or the job was reset
#}
{% macro heartbeat_row_status(lifecycle_event, pending_events) -%}
case
    when {{ lifecycle_event }} in ({{ heartbeat_request_types() }}) then 'IN_PROGRESS'
    when {{ lifecycle_event }} = 'REFUSED' then 'REFUSED'
    when {{ lifecycle_event }} = 'FAILED' then 'FAILED'
    when {{ pending_events }} > 0 then 'NEW_EVENT_AVAILABLE'
    when {{ lifecycle_event }} = 'COMPLETED' then 'COMPLETED'
    else cast(null as string)
  end
{%- endmacro %}

{#
  When a row's status (heartbeat_row_status) last changed: a row waiting for data since the first pending
  event, any other status since its job's latest lifecycle event; NULL for no status.
#}
{% macro heartbeat_status_change_ts(status, first_pending_ts, lifecycle_ts) -%}
case
    when {{ status }} = 'NEW_EVENT_AVAILABLE' then {{ first_pending_ts }}
    when {{ status }} is not null then {{ lifecycle_ts }}
  end
{%- endmacro %}

{# When the row's run started (its job's latest request), for a row that has a run: running or ended. #}
{% macro heartbeat_job_start_ts(status, last_trigger_ts) -%}
case when {{ status }} in ('IN_PROGRESS', {{ heartbeat_run_end_types() }}) then {{ last_trigger_ts }} end
{%- endmacro %}

{#
  When the row's run ended (the spec: job_start_timestamp when the job was triggered, job_end_timestamp its
  completion time): for a row whose status is its run's end, and only when the latest lifecycle event is that
  end (a reset or a request since leaves no ended run); `lifecycle_end_ts` is heartbeat_lifecycle_end_ts.
#}
{% macro heartbeat_job_end_ts(status, last_lifecycle_event, lifecycle_end_ts) -%}
case
    when {{ status }} in ({{ heartbeat_run_end_types() }})
         and {{ last_lifecycle_event }} in ({{ heartbeat_run_end_types() }})
      then {{ lifecycle_end_ts }}
  end
{%- endmacro %}

{#
  When a lifecycle event's run ended: the run's own end as the jobs backend recorded it (payload
  run_ended_at: a local process's exit, the jobs service's end time), else the event's time (the tick that
  noticed it, `complete`'s).
#}
{% macro heartbeat_lifecycle_end_ts(run_ended_at, event_ts) -%}
coalesce({{ run_ended_at }}, {{ event_ts }})
{%- endmacro %}

{# The run end a run's end event's payload carries (NULL where the backend does not know). #}
{% macro heartbeat_run_ended_at(payload) -%}
cast(get_json_object({{ payload }}, '$.run_ended_at') as timestamp)
{%- endmacro %}

{#
  Whether a NEW_DATA event at `event_ts` is pending for a row: recorded after the row's job last consumed its
  data (its latest trigger request or reset) and after the row was created, both given as `consumed_after`
  (heartbeat_consumed_after). Event times are causally stamped (a writer stamps after every event it read),
  so comparing them orders the commits.
#}
{% macro heartbeat_is_pending(event_ts, consumed_after) -%}
({{ event_ts }} > {{ consumed_after }})
{%- endmacro %}

{# Where a row's data was last consumed: its job's latest trigger request or reset, not before the row's creation. #}
{% macro heartbeat_consumed_after(row_created_ts, consumed_ts) -%}
greatest({{ row_created_ts }}, coalesce({{ consumed_ts }}, {{ row_created_ts }}))
{%- endmacro %}

{# The pending events' ids as the row lists them: sorted, comma-separated, NULL for none (an array of ids). #}
{% macro heartbeat_pending_ids(event_ids) -%}
nullif(concat_ws(',', sort_array({{ event_ids }})), '')
{%- endmacro %}

{#
  A row's consecutive failures: the failures since the request a retry re-runs (`base_ts`, the control
  table's base_requested_ts). `counted` failures are known already (a built row's count; 0 when deriving
  from all the events), to which those of the array `failed_ts` recorded after `base_ts` are added.
#}
{% macro heartbeat_consecutive_failures(counted, failed_ts, base_ts) -%}
cast({{ counted }} + size(filter(coalesce({{ failed_ts }}, array()), failed -> failed > {{ base_ts }})) as bigint)
{%- endmacro %}

{#
  A row's last error: its job's failure or refusal message while the job is FAILED or REFUSED, else the jobs
  API's latest refusal
  of a request (TRIGGER_ERROR) when it came after the latest lifecycle event; NULL otherwise.
#}
{% macro heartbeat_last_error(lifecycle_event, lifecycle_message, lifecycle_ts, trigger_error_ts, trigger_error_message) -%}
case
    when {{ lifecycle_event }} in ('FAILED', 'REFUSED') then {{ lifecycle_message }}
    when {{ trigger_error_ts }} > coalesce({{ lifecycle_ts }}, timestamp '1900-01-01') then {{ trigger_error_message }}
  end
{%- endmacro %}

{# The catch-up sequence a request's payload plans: which run of how many, and the windows. #}
{% macro heartbeat_sequence_run(payload) -%}
cast(get_json_object({{ payload }}, '$._run') as int)
{%- endmacro %}

{% macro heartbeat_sequence_runs(payload) -%}
cast(get_json_object({{ payload }}, '$._runs') as int)
{%- endmacro %}

{% macro heartbeat_sequence_windows(payload) -%}
get_json_object({{ payload }}, '$.heartbeat_windows')
{%- endmacro %}

{#
  What a built row keeps of its times only inside its status columns (the invariants above), for a fold
  that needs them again. Each is right where the rule that reads it reads it, NULL where the row cannot say:
  - the latest lifecycle event's time: the status change of a row whose status is its lifecycle's
    (IN_PROGRESS, COMPLETED, FAILED, REFUSED);
  - the first pending event's time: the status change of a row waiting for data (NEW_EVENT_AVAILABLE).
#}
{% macro heartbeat_built_lifecycle_ts(row) -%}
case when {{ row }}.status in ('IN_PROGRESS', {{ heartbeat_run_end_types() }}) then {{ row }}.status_change_timestamp end
{%- endmacro %}

{% macro heartbeat_built_first_pending_ts(row) -%}
case when {{ row }}.status = 'NEW_EVENT_AVAILABLE' then {{ row }}.status_change_timestamp end
{%- endmacro %}
