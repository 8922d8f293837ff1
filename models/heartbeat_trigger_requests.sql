{#
  Every trigger request recorded (first tries, automatic retries, next runs of a sequence), one row per
  idempotency token: the first time it was requested, with the job parameters sent.
  Reconciliation rebuilds a request from here to resume it with the same token.
#}
{{ config(materialized='view') }}

select idempotency_token, trigger_job_id, event_type, event_ts, payload
from (
  select e.*, row_number() over (partition by idempotency_token order by event_ts, event_id) as attempt
  from {{ heartbeat_events() }} e
  where event_type in ({{ heartbeat_request_types() }}) and idempotency_token is not null
) requests
where attempt = 1
