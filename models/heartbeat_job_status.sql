{#
  One row per job and status over its active control rows: what reconciliation needs
  about a job that is IN_PROGRESS (its run id and request tokens) or FAILED / REFUSED (its
  consecutive failures and when the last run ended). The runner reads it with the
  status bound as a parameter.
#}
{{ config(materialized='view') }}

select
  trigger_job_id,
  status,
  max(trigger_job_name) as trigger_job_name,
  max(job_run_id) as job_run_id,
  max(last_idempotency_token) as last_idempotency_token,
  max(base_idempotency_token) as base_idempotency_token,
  max(consecutive_failures) as consecutive_failures,
  max(job_start_timestamp) as job_start_timestamp,
  max(job_end_timestamp) as job_end_timestamp,
  max(status_change_timestamp) as status_change_timestamp
from {{ ref('heartbeat_control') }}
where is_active and status is not null
group by trigger_job_id, status
