{#
  The events the control table still needs: one row per event id of the hot log
  (heartbeat_events) that the derivation in heartbeat_control can still read. Every
  other event is history: `maintain` moves it to heartbeat_events_archive, so builds
  read a log whose size follows the number of config rows, not the lakehouse's age.

  An event stays when it is any of:
    - newer than the safety margin (var heartbeat_archive_margin_minutes, default 10);
    - the latest CONFIG_LOADED;
    - of a job, from the job's keep-from point on: the earlier of its latest *settled*
      lifecycle event (COMPLETED, FAILED, REFUSED, RESET, or a request the jobs API answered
      with a run) and its latest settled (else latest) TRIGGER_REQUESTED. A request
      without an answer can still be voided by a TRIGGER_ERROR, which brings the
      earlier state back; settled events never change, so what is older is dead;
    - a job's latest TRIGGER_ERROR, latest pause/resume and latest WINDOW_SKIPPED (where its
      event-time windows were planned until, when the last plan skipped every window);
    - of a source: its latest cursor event (the cursor), its latest NEW_DATA (the
      latest fetch), and every NEW_DATA that a control row reading it (active or
      retired) has not consumed for good: newer than the row's creation and than its
      job's latest settled consuming event (a request with a run, or a RESET).

  Whether heartbeat_control derived from the live events alone equals the one derived
  from every event is what tests/test_growth.py checks on random histories.
#}
{{ config(materialized='view') }}

with events as {{ heartbeat_events() }},

{# a request whose run the jobs service skipped (RUN_SKIPPED) is void, as if never answered #}
answered as (
  select idempotency_token from events where event_type in ('TRIGGERED', 'RUN_SKIPPED')
  group by idempotency_token
  having max(case when event_type = 'RUN_SKIPPED' then 1 else 0 end) = 0
),

job_events as (
  select e.*, a.idempotency_token is not null as answered
  from events e
  left join answered a on a.idempotency_token = e.idempotency_token
  where e.trigger_job_id is not null
),

settled as (
  select * from job_events
  where event_type in ({{ heartbeat_run_end_types() }}, 'RESET')
     or (event_type in ({{ heartbeat_request_types() }}) and answered)
),

keep_from as (
  select
    j.trigger_job_id,
    least(
      coalesce(max(case when s.event_type is not null then s.event_ts end), timestamp '9999-12-31'),
      coalesce(
        max(case when j.event_type = 'TRIGGER_REQUESTED' and j.answered then j.event_ts end),
        max(case when j.event_type = 'TRIGGER_REQUESTED' then j.event_ts end),
        timestamp '9999-12-31'
      )
    ) as keep_ts,
    max(case when s.event_type in ('TRIGGER_REQUESTED', 'RESET') then s.event_ts end) as consumed_ts
  from job_events j
  left join settled s on s.event_id = j.event_id
  group by j.trigger_job_id
),

latest_of_kind as (
  select event_id from (
    select
      event_id,
      row_number() over (
        partition by
          case when event_type in ('JOB_PAUSED', 'JOB_RESUMED') then 'pause' else event_type end,
          coalesce(trigger_job_id, '')
        order by event_ts desc, event_id desc
      ) as recency
    from events
    where event_type in ('CONFIG_LOADED', 'TRIGGER_ERROR', 'JOB_PAUSED', 'JOB_RESUMED', 'WINDOW_SKIPPED')
  ) ranked
  where recency = 1
),

latest_of_source as (
  select event_id from (
    select
      event_id,
      row_number() over (partition by source_key order by event_ts desc, event_id desc) as cursor_recency,
      dense_rank() over (partition by source_key, event_type = 'NEW_DATA' order by snapshot_ts desc) as fetch_recency,
      event_type
    from events
    where source_key is not null and event_type in ('NEW_DATA', 'CURSOR', 'RESET')
  ) ranked
  where cursor_recency = 1 or (event_type = 'NEW_DATA' and fetch_recency = 1)
),

{# per source: NEW_DATA after this point may still be pending for some row reading it #}
unconsumed_from as (
  select
    c.source_key,
    min(greatest(c.row_created_timestamp, coalesce(k.consumed_ts, c.row_created_timestamp))) as from_ts
  from {{ ref('heartbeat_control') }} c
  left join keep_from k on k.trigger_job_id = c.trigger_job_id
  group by c.source_key
),

margin as (
  select max(event_ts) - interval {{ (var('heartbeat_archive_margin_minutes', 10) * 60) | int }} seconds as since
  from events
)

select e.event_id
from events e
cross join margin m
left join keep_from k on k.trigger_job_id = e.trigger_job_id
left join unconsumed_from u on u.source_key = e.source_key and e.event_type = 'NEW_DATA'
where e.event_ts >= m.since
   or (e.trigger_job_id is not null and (k.keep_ts is null or e.event_ts >= k.keep_ts))
   or (u.from_ts is not null and e.event_ts > u.from_ts)
   or e.event_type not in ('CONFIG_LOADED', 'NEW_DATA', 'CURSOR', 'RESET', 'TRIGGER_REQUESTED', 'RETRY_REQUESTED',
                           'NEXT_WINDOW_REQUESTED', 'WINDOW_SKIPPED', 'TRIGGERED', 'TRIGGER_ERROR', {{ heartbeat_run_end_types() }}, 'JOB_PAUSED',
                           'JOB_RESUMED')

union

select event_id from latest_of_kind

union

select event_id from latest_of_source
