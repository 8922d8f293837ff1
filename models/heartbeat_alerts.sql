{#
  One row per alert Heartbeat raised (docs/alerts.md): what it is about, whether it is still open,
  and which destinations accepted its raise and its resolve. A Databricks SQL alert or a dashboard
  can read it: `select * from heartbeat_alerts where is_open`.

  Built from the alert events of heartbeat_events (hot log and archive): ALERT_RAISED and
  ALERT_RESOLVED carry the alert (payload), ALERT_UPDATED its new words when its cause moved on
  (the summary is the latest words), ALERT_SENT / ALERT_DELIVERY_FAILED one destination's answer.
  idempotency_token holds the alert key on all five.
#}
{{ config(materialized='view') }}

with events as {{ heartbeat_events(all_history=true) }},

alert_events as (
  select
    event_type, event_ts, message, payload,
    idempotency_token as alert_key,
    get_json_object(payload, '$.action') as action,
    get_json_object(payload, '$.destination') as destination
  from events
  where event_type in ('ALERT_RAISED', 'ALERT_UPDATED', 'ALERT_RESOLVED', 'ALERT_SENT', 'ALERT_DELIVERY_FAILED')
),

raised as (
  select alert_key, min(event_ts) as raised_at, max(payload) as payload
  from alert_events where event_type = 'ALERT_RAISED'
  group by alert_key
),

worded as (
  select
    alert_key,
    max_by(message, event_ts) as summary,
    max(case when event_type = 'ALERT_UPDATED' then event_ts end) as updated_at
  from alert_events where event_type in ('ALERT_RAISED', 'ALERT_UPDATED')
  group by alert_key
),

resolved as (
  select alert_key, min(event_ts) as resolved_at
  from alert_events where event_type = 'ALERT_RESOLVED'
  group by alert_key
),

deliveries as (
  select
    alert_key,
    concat_ws(',', sort_array(collect_set(case when event_type = 'ALERT_SENT' and action = 'raise'
                                               then destination end))) as raise_delivered_to,
    concat_ws(',', sort_array(collect_set(case when event_type = 'ALERT_SENT' and action = 'resolve'
                                               then destination end))) as resolve_delivered_to,
    sum(case when event_type = 'ALERT_DELIVERY_FAILED' then 1 else 0 end) as failed_deliveries,
    max_by(case when event_type = 'ALERT_DELIVERY_FAILED' then message end,
           case when event_type = 'ALERT_DELIVERY_FAILED' then event_ts end) as last_delivery_error
  from alert_events
  where event_type in ('ALERT_SENT', 'ALERT_DELIVERY_FAILED')
  group by alert_key
)

select
  r.alert_key,
  get_json_object(r.payload, '$.kind') as kind,
  get_json_object(r.payload, '$.severity') as severity,
  get_json_object(r.payload, '$.subject') as subject,
  w.summary,
  get_json_object(r.payload, '$.jobs') as jobs,
  get_json_object(r.payload, '$.link') as link,
  cast(get_json_object(r.payload, '$.since') as timestamp) as since_ts,
  r.raised_at,
  w.updated_at,
  s.resolved_at,
  s.resolved_at is null as is_open,
  get_json_object(r.payload, '$.destinations') as destinations,
  nullif(d.raise_delivered_to, '') as raise_delivered_to,
  nullif(d.resolve_delivered_to, '') as resolve_delivered_to,
  coalesce(d.failed_deliveries, 0) as failed_deliveries,
  d.last_delivery_error
from raised r
join worded w on w.alert_key = r.alert_key
left join resolved s on s.alert_key = r.alert_key
left join deliveries d on d.alert_key = r.alert_key
