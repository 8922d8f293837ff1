{#
  The latest run Heartbeat requested of each job (one row per job that has one): the
  overview's "last run" column, with its outcome, duration and the windows it consumed.
#}
{{ config(materialized='view') }}

select * from (
  select r.*, row_number() over (partition by trigger_job_id order by requested_at desc) as recency
  from {{ ref('heartbeat_job_runs') }} r
) ranked
where recency = 1
