{#
  Operator retries waiting for the next tick: one row per FAILED or REFUSED job with a RETRY_ASKED
  event (from `retry` or the page) newer than the failure or refusal. The tick re-runs such a job over
  the data of the request that failed, with a new idempotency token, as an automatic retry
  would; once that request is recorded the job is IN_PROGRESS and the ask is history. Asks
  made again before the tick collapse into one row: one retry, whoever asked.
#}
{{ config(materialized='view') }}

select
  a.trigger_job_id,
  max(a.event_ts) as asked_ts,
  max_by(a.payload, a.event_ts) as payload,
  count(*) as asks
from {{ heartbeat_events() }} a
join {{ ref('heartbeat_job_status') }} f
  on f.trigger_job_id = a.trigger_job_id and f.status in ({{ heartbeat_blocked_statuses() }})
where a.event_type = 'RETRY_ASKED' and a.event_ts > f.job_end_timestamp
group by a.trigger_job_id
