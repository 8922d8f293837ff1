"""The ``kafka`` source against a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from services import assert_config_check, engine, free_port, kafka_broker, sense_context, sensing_target  # noqa: F401 (fixtures)

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.sensing.sources.kafka import KafkaSource

SOURCE = KafkaSource()


@pytest.fixture
def topic(kafka_broker) -> str:
    name = f"orders.{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(name, partitions=2)
    return name


@pytest.fixture
def ctx(engine, kafka_broker):
    return sense_context(engine, {"kafka": {"shop": {"bootstrap.servers": kafka_broker.bootstrap,
                                                     "heartbeat.timeout.s": 5}}})


def sense(ctx, topic: str, cursor: str | None = None, **fields):
    return SOURCE.sense(sensing_target("kafka", f"shop: {topic}", cursor, **fields), ctx)


@pytest.mark.parametrize("sensor_id, upstream_key, problem", [
    ("my_product: my.topic", None, None),
    ("my-product:my_topic-1", "timestamp", None),
    ("my.topic", None, "must be '<data product>: <topic>'"),
    ("my_product: bad topic", None, "Kafka topic"),
    ("my product: t", None, "data product"),
    (": t", None, "data product"),
    ("p: t", "load_date", "upstream_key 'load_date'"),
])
def test_check_config(sensor_id, upstream_key, problem):
    assert_config_check(SOURCE, sensor_id, upstream_key, problem)


def test_new_sensor_gets_a_baseline_then_sees_only_later_messages(ctx, kafka_broker, topic):
    kafka_broker.produce(topic, "old-1", "old-2", partition=0)
    kafka_broker.produce(topic, "old-3", partition=1)

    baseline = sense(ctx, topic)
    assert not baseline.new_data
    assert json.loads(baseline.cursor_to) == {"0": 2, "1": 1}

    quiet = sense(ctx, topic, baseline.cursor_to)
    assert not quiet.new_data and quiet.cursor_to is None

    kafka_broker.produce(topic, "new-1", partition=1)
    first = sense(ctx, topic, baseline.cursor_to)
    assert first.new_data and first.rows == 1
    assert json.loads(first.cursor_to) == {"0": 2, "1": 2}
    assert first.window_from == "0:2,1:1" and first.window_to == "0:2,1:2"

    assert not sense(ctx, topic, first.cursor_to).new_data
    kafka_broker.produce(topic, "new-2", "new-3", partition=0)
    second = sense(ctx, topic, first.cursor_to)
    assert second.new_data and second.rows == 2
    assert json.loads(second.cursor_to) == {"0": 4, "1": 2}


def test_replay_reads_a_new_sensor_from_the_beginning(engine, kafka_broker, topic):
    kafka_broker.produce(topic, "a", "b", partition=0)
    ctx = sense_context(engine, {"kafka": {"shop": {"bootstrap.servers": kafka_broker.bootstrap}}}, replay=True)
    result = sense(ctx, topic)
    assert result.new_data and result.rows == 2
    assert result.window_from == "0:0,1:0"


def test_preprocess_query_filters_messages_and_the_cursor_still_advances(ctx, kafka_broker, topic):
    query = "SELECT * FROM sensor_new_data WHERE ?upstream_key LIKE 'keep%' AND topic IS NOT NULL AND offset >= 0"
    baseline = sense(ctx, topic).cursor_to
    kafka_broker.produce(topic, "skip-1", "skip-2", partition=0)

    filtered = sense(ctx, topic, baseline, upstream_key="value", preprocess_query=query)
    assert not filtered.new_data and filtered.rows == 0
    assert json.loads(filtered.cursor_to) == {"0": 2, "1": 0}

    kafka_broker.produce(topic, "skip-3", partition=0)
    kafka_broker.produce(topic, "keep-1", partition=1, key="k")
    kept = sense(ctx, topic, filtered.cursor_to, upstream_key="value", preprocess_query=query)
    assert kept.new_data and kept.rows == 1
    assert json.loads(kept.cursor_to) == {"0": 3, "1": 1}


def test_a_capped_read_resumes_where_it_stopped(engine, kafka_broker, topic):
    settings = {"bootstrap.servers": kafka_broker.bootstrap, "heartbeat.max.messages": 2}
    ctx = sense_context(engine, {"kafka": {"shop": settings}})
    query = "SELECT * FROM sensor_new_data WHERE value = 'wanted'"
    baseline = sense(ctx, topic).cursor_to
    kafka_broker.produce(topic, "x", "y", "wanted", partition=0)

    capped = sense(ctx, topic, baseline, preprocess_query=query)
    assert not capped.new_data and json.loads(capped.cursor_to) == {"0": 2, "1": 0}
    assert "capped" in capped.detail
    rest = sense(ctx, topic, capped.cursor_to, preprocess_query=query)
    assert rest.new_data and json.loads(rest.cursor_to) == {"0": 3, "1": 0}


def test_settings_from_the_environment(engine, kafka_broker, topic, monkeypatch):
    monkeypatch.setenv("HEARTBEAT_KAFKA_MY_SHOP_EU_BOOTSTRAP_SERVERS", kafka_broker.bootstrap)
    result = KafkaSource().sense(sensing_target("kafka", f"my-shop.eu: {topic}"), sense_context(engine))
    assert json.loads(result.cursor_to) == {"0": 0, "1": 0}


def test_missing_connection_settings_name_the_file_section_and_variable(engine, topic):
    with pytest.raises(SourceError, match=r"kafka\.nobody.*HEARTBEAT_KAFKA_NOBODY_BOOTSTRAP_SERVERS"):
        KafkaSource().sense(sensing_target("kafka", f"nobody: {topic}"), sense_context(engine))


def test_missing_topic_is_a_clear_error(ctx):
    with pytest.raises(SourceError, match="the topic does not exist"):
        sense(ctx, "no.such.topic")


def test_unreachable_broker_fails_fast(engine):
    ctx = sense_context(engine, {"kafka": {"shop": {"bootstrap.servers": f"127.0.0.1:{free_port()}"}}})
    began = time.monotonic()
    with pytest.raises(SourceError, match=r"Kafka shop: t1 \(127\.0\.0\.1:\d+\): .*brokers are down"):
        sense(ctx, "t1")
    assert time.monotonic() - began < 5  # well under the 10 s default timeout


def test_unknown_heartbeat_setting_is_rejected(engine, kafka_broker):
    ctx = sense_context(engine, {"kafka": {"shop": {"bootstrap.servers": kafka_broker.bootstrap,
                                                    "heartbeat.timeout": 1}}})
    with pytest.raises(SourceError, match="unknown setting"):
        sense(ctx, "t1")


def test_the_bulk_look_rules_out_only_topics_with_nothing_after_their_cursor(engine, kafka_broker):
    quiet, busy, ahead = (f"bulk.{name}.{uuid.uuid4().hex[:6]}" for name in ("quiet", "busy", "ahead"))
    for name in (quiet, busy, ahead):
        kafka_broker.create_topic(name, partitions=2)
        kafka_broker.produce(name, "before", partition=1)
    down = f"127.0.0.1:{free_port()}"
    ctx = sense_context(engine, {"kafka": {"shop": {"bootstrap.servers": kafka_broker.bootstrap},
                                           "gone": {"bootstrap.servers": down, "heartbeat.timeout.s": 2}}})
    cursors = {name: SOURCE.sense(sensing_target("kafka", f"shop: {name}"), ctx).cursor_to
               for name in (quiet, busy, ahead)}
    kafka_broker.produce(busy, "after", partition=0)
    targets = [sensing_target("kafka", f"shop: {quiet}", cursors[quiet]),
               sensing_target("kafka", f"shop: {busy}", cursors[busy]),
               sensing_target("kafka", f"shop: {ahead}", json.dumps({"0": 5, "1": 1})),  # topic re-created?
               sensing_target("kafka", f"shop: {ahead}", json.dumps({"0": 0})),  # a partition it never saw
               sensing_target("kafka", "shop: no.such.topic", json.dumps({"0": 0})),
               sensing_target("kafka", f"shop: {uuid.uuid4().hex}"),  # new: no cursor
               sensing_target("kafka", f"gone: {quiet}", cursors[quiet])]

    began = time.monotonic()
    ruled_out = SOURCE.unchanged(targets, ctx)

    assert ruled_out == {f"kafka:shop: {quiet}": "no message after 0:0,1:1"}
    assert time.monotonic() - began < 4  # the product whose brokers are down gave up, the other answered
    assert not SOURCE.sense(targets[0], ctx).new_data  # what sensing it would have found
    assert SOURCE.sense(targets[1], ctx).new_data
    with pytest.raises(SourceError, match="behind the cursor"):
        SOURCE.sense(targets[2], ctx)
