{# Generic data tests for the sensor config seed. #}

{% test heartbeat_unique_combination(model, columns) %}
  select {{ columns | join(', ') }}, count(*) as copies
  from {{ model }}
  group by {{ columns | join(', ') }}
  having count(*) > 1
{% endtest %}

{# accepted_values after trimming and ignoring case, as the runner normalises them. #}
{% test heartbeat_accepted_values_normalized(model, column_name, values) %}
  select {{ column_name }}
  from {{ model }}
  where {{ heartbeat_clean(column_name) }} is not null
    and upper(trim({{ column_name }})) not in (
      {%- for v in values %}'{{ v | upper }}'{{ ',' if not loop.last }}{% endfor -%}
    )
{% endtest %}

{% test heartbeat_every_job_has_a_hard_dependency(model) %}
  select trim(trigger_job_id) as trigger_job_id
  from {{ model }}
  group by trim(trigger_job_id)
  having sum(case when {{ heartbeat_is_true('dependency_flag') }} then 1 else 0 end) = 0
{% endtest %}
