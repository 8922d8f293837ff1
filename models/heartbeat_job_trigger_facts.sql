{#
  What the trigger holds of the run-policy file read (trigger shaping, issue 57;
  heartbeat_runner/policies/trigger_shaping.py holds the rule): one row per active job.

    - last_start: the job's latest trigger request of any kind (first try, operator's
      run, retry, next run of a sequence): min_interval counts from it, and a fire
      time of `at` must come after it;
    - first_arrival / last_arrival: when its oldest and newest unconsumed new data were
      recorded (quiet_for counts from the newest, max_wait from the oldest);
    - added_at: when its first control row was created (`at` counts fire times from
      then for a job that never ran).

  A held job's data stays in its rows (nothing here consumes anything), so the run a
  hold releases covers all of it. The runner reads this view only when the run-policy
  file has a trigger section, with the jobs bound as a parameter.
#}
{{ config(materialized='view') }}

with starts as (
  select trigger_job_id, max(event_ts) as last_start
  from {{ heartbeat_events() }} e
  where event_type in ({{ heartbeat_request_types() }})
  group by trigger_job_id
)

select
  c.trigger_job_id,
  min(case when c.status = 'NEW_EVENT_AVAILABLE' then c.status_change_timestamp end) as first_arrival,
  max(case when c.status = 'NEW_EVENT_AVAILABLE' then c.latest_event_fetched_timestamp end) as last_arrival,
  min(c.row_created_timestamp) as added_at,
  max(s.last_start) as last_start
from {{ ref('heartbeat_control') }} c
left join starts s on s.trigger_job_id = c.trigger_job_id
where c.is_active
group by c.trigger_job_id
