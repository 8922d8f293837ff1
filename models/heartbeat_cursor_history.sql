{#
  Every cursor each source has had: one row per NEW_DATA, CURSOR or RESET event of
  the source, in force from its event_ts (valid_from) until the next one
  (valid_until; NULL for the current cursor), over the whole history (hot log and
  archive). `reset --since T` moves a source back to the cursor in force at T.
#}
{{ config(materialized='view') }}

select
  source_key,
  sensor_source,
  sensor_id,
  event_id,
  event_type,
  run_id,
  cursor_from,
  cursor_to,
  window_from,
  window_to,
  event_ts as valid_from,
  lead(event_ts) over (partition by source_key order by event_ts, event_id) as valid_until
from {{ heartbeat_cursor_events(all_history=true) }}
