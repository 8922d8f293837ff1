{#
  Every per-source row of the run report, hot and archived (`runs --run-id`). A row
  caught in both tables by a crash while archiving is an exact copy, so UNION keeps one.
#}
{{ config(materialized='view') }}

select * from {{ source('heartbeat', 'heartbeat_run_report') }}
union
select * from {{ source('heartbeat', 'heartbeat_run_report_archive') }}
