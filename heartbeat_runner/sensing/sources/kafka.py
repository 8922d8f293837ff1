"""``kafka``: new messages on a topic, per partition.

sensor_id is ``<data product>: <topic>``. The data product names the connection:
``kafka.<data product>`` in heartbeat_sources.yml holds librdkafka settings
(``bootstrap.servers``, ``security.protocol``, ``sasl.*``, secrets as ``{env: NAME}``);
``HEARTBEAT_KAFKA_<DATA_PRODUCT>_BOOTSTRAP_SERVERS`` (and ``_SECURITY_PROTOCOL``,
``_SASL_MECHANISM``, ``_SASL_USERNAME``, ``_SASL_PASSWORD``) fill what the file lacks.
Two settings are Heartbeat's own: ``heartbeat.timeout.s`` (default 10) bounds every
broker call, ``heartbeat.max.messages`` (default 100000) bounds the messages one sense
reads for ``preprocess_query``.

New data means end offsets beyond the stored ones. With ``preprocess_query`` the new
messages are read (no consumer group: partitions are assigned) and the query sees them
as ``sensor_new_data`` (key, value, topic, partition, offset, timestamp); the cursor
moves to what was read, so a capped read resumes on the next tick.

Cursor: ``{"<partition>": next offset}``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from heartbeat_runner.core.errors import SourceError
from heartbeat_runner.core.windows import EventTimes, SourceWindow, WindowLimit, epoch_seconds
from heartbeat_runner.sensing.connections import connection_settings
from heartbeat_runner.sensing.sources.base import (
    LineageDataset,
    LineageNaming,
    SenseContext,
    SenseResult,
    SensingTarget,
    Source,
    dump_cursor,
    load_cursor,
)
from heartbeat_runner.sensing.sources.common import check_connection_name, check_upstream_key, split_reference

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import Consumer, KafkaError

NEW_DATA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
ENV_SETTINGS = {
    "BOOTSTRAP_SERVERS": "bootstrap.servers",
    "SECURITY_PROTOCOL": "security.protocol",
    "SASL_MECHANISM": "sasl.mechanism",
    "SASL_USERNAME": "sasl.username",
    "SASL_PASSWORD": "sasl.password",
}
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_MESSAGES = 100_000
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_POLL_S = 0.25
READ_TO_THE_END = {"isolation.level": "read_uncommitted"}
log = logging.getLogger(__name__)


class KafkaSource(Source):
    source_types: ClassVar[tuple[str, ...]] = ("kafka",)
    reports_event_times: ClassVar[bool] = True

    def split(self, window: SourceWindow, limit: WindowLimit, upstream_key: str | None) -> list[SourceWindow]:
        """Runs of at most ``limit`` offsets per partition, oldest first."""
        if limit.count is None:
            raise SourceError(f"max_window {limit} is a time span, but Kafka windows are offsets: "
                              "give a number of messages per partition (e.g. 10000)")
        before = {int(p): int(o) for p, o in (load_cursor(window.cursor_from) or {}).items()}
        after = {int(p): int(o) for p, o in (load_cursor(window.cursor_to) or {}).items()}
        if not before:
            return [window]  # replayed from the start of the topic: the earliest offsets are not recorded
        step, pieces, lo = limit.count, [], dict(before)
        while any(lo.get(p, 0) < o for p, o in after.items()):
            hi = {p: min(lo.get(p, 0) + step, o) for p, o in after.items()}
            pieces.append(SourceWindow(window.sensor_source, window.sensor_id, _dump(lo), _dump(hi),
                                       _offsets(lo), _offsets(hi)))
            lo = hi
        return pieces or [window]

    def lineage_dataset(self, sensor_source: str, sensor_id: str, naming: LineageNaming) -> LineageDataset:
        """``kafka://<first bootstrap server>`` / ``<topic>``; ``kafka://<data product>`` when the connections
        file does not give the servers as text."""
        product, topic = split_reference(sensor_id)
        servers = naming.connections.get("kafka", {}).get(product or "", {}).get("bootstrap.servers")
        first = servers.split(",")[0].strip() if isinstance(servers, str) else ""
        server = first.partition("://")[2] or first  # SASL_SSL://host:9093 names the protocol too
        return LineageDataset(f"kafka://{server or product}", topic)

    def check_config(self, sensor_id: str, upstream_key: str | None) -> str | None:
        product, topic = split_reference(sensor_id)
        if product is None:
            return f"{sensor_id!r} must be '<data product>: <topic>'"
        if not _TOPIC.match(topic):
            return f"Kafka topic {topic!r} must be 1-249 letters, digits, '.', '_' or '-'"
        return check_connection_name(product, "data product") or check_upstream_key(
            upstream_key, NEW_DATA_COLUMNS, "kafka")

    def unchanged(self, targets: Sequence[SensingTarget], ctx: SenseContext) -> dict[str, str]:
        """Topics with no message after their cursor: per data product, one consumer asks for the metadata
        and for the end of every partition of its topics in one request each (a consumer per topic and a
        request per partition otherwise). A topic is ruled out only when its partitions are the cursor's and
        each ends exactly at the cursor's offset; a new partition, a cursor past the end, a data product whose
        brokers do not answer leave their topics to :meth:`sense`, which reports what is wrong."""
        out: dict[str, str] = {}
        for product, topics in sorted(self._by_product(targets).items()):
            cursors = {target.source_key: (topic, cursor) for topic, group in topics.items() for target in group
                       if (cursor := _stored_offsets(target.cursor))}
            if not cursors:
                continue
            try:
                settings = connection_settings(ctx.connections, "kafka", product, ENV_SETTINGS, ctx.secrets)
                looked_at = sorted({topic for topic, _ in cursors.values()})
                # read_uncommitted: the end is the high watermark, never before what sense() sees
                with _Broker(product, f"{len(looked_at)} topic(s)", settings, READ_TO_THE_END) as broker:
                    ends = broker.end_offsets(looked_at)
            except Exception as exc:  # noqa: BLE001 - in doubt, leave them in: sensing reports what is wrong
                log.debug("Kafka %s: no bulk look (%s); its topics are sensed one by one", product, exc)
                continue
            out.update({key: f"no message after {_offsets(cursor)}" for key, (topic, cursor) in cursors.items()
                        if ends.get(topic) == cursor})
        return out

    def watch(self, targets: Sequence[SensingTarget], ctx: SenseContext,
              wake: Callable[[str], None]) -> KafkaWatch | None:
        """Wake-ups from a long-polling consumer per data product (:class:`KafkaWatch`)."""
        products: dict[str, tuple[dict[str, Any], dict[str, frozenset[str]]]] = {}
        for product, topics in self._by_product(targets).items():
            try:
                settings = connection_settings(ctx.connections, "kafka", product, ENV_SETTINGS, ctx.secrets)
            except SourceError:
                continue  # sensing reports it
            products[product] = (settings, {topic: frozenset(t.source_key for t in group)
                                            for topic, group in topics.items()})
        return KafkaWatch(products, wake).start() if products else None

    def _by_product(self, targets: Sequence[SensingTarget]) -> dict[str, dict[str, list[SensingTarget]]]:
        """The targets whose config is valid (:meth:`check_config`; sensing reports the others), by data product
        and topic."""
        found: dict[str, dict[str, list[SensingTarget]]] = {}
        for target in targets:
            product, topic = split_reference(target.sensor_id)
            if product is not None and not self.check_config(target.sensor_id, target.upstream_key):
                found.setdefault(product, {}).setdefault(topic, []).append(target)
        return found

    def sense(self, target: SensingTarget, ctx: SenseContext) -> SenseResult:
        problem = self.check_config(target.sensor_id, target.upstream_key)
        if problem:
            raise SourceError(problem)
        product, topic = split_reference(target.sensor_id)
        if product is None:  # check_config refuses a sensor_id without a data product
            raise SourceError(f"{target.sensor_id!r} must be '<data product>: <topic>'")
        settings = connection_settings(ctx.connections, "kafka", product, ENV_SETTINGS, ctx.secrets)
        with _Broker(product, topic, settings) as broker:
            low, high = broker.watermarks()
            cursor = load_cursor(target.cursor)
            if cursor is None and not ctx.replay_new_sensors:
                return SenseResult(new_data=False, cursor_to=_dump(high), window_to=_offsets(high),
                                   detail="new sensor: baseline at the end of the topic")
            start = _start_offsets(cursor or {}, low, high, target.sensor_id)
            new = {p: high[p] - start[p] for p in high if high[p] > start[p]}
            if not new:
                return SenseResult(new_data=False, detail=f"no message after {_offsets(start)}")
            grain = ctx.event_time_grains.get(target.source_key)
            if not target.preprocess_query and grain is None:
                return SenseResult(new_data=True, cursor_to=_dump(high), window_from=_offsets(start),
                                   window_to=_offsets(high), rows=sum(new.values()))
            records, reached = broker.read(start, high)
        rows = ctx.count_preprocessed_records(records, target)
        return SenseResult(new_data=rows > 0, cursor_to=_dump(reached), window_from=_offsets(start),
                           window_to=_offsets(reached), rows=rows,
                           detail=None if reached == high else f"read {len(records)} messages (capped)",
                           event_times=_event_times(records, grain) if grain else None)


def _start_offsets(cursor: dict[str, int], low: dict[int, int], high: dict[int, int], sensor_id: str) -> dict[int, int]:
    """Where to read from: the stored offset, or the earliest kept one (new partition, expired messages)."""
    start = {}
    for partition in high:
        stored = cursor.get(str(partition))
        if stored is not None and stored > high[partition]:
            raise SourceError(f"Kafka {sensor_id!r} partition {partition} ends at offset {high[partition]}, "
                              f"behind the cursor {stored} (topic re-created?); use `reset` to re-process it")
        start[partition] = max(low[partition], stored if stored is not None else low[partition])
    return start


def _stored_offsets(cursor: str | None) -> dict[int, int] | None:
    """A cursor's offsets by partition; None for no cursor or one that is not a Kafka cursor."""
    try:
        found = load_cursor(cursor)
        return None if found is None else {int(p): int(o) for p, o in found.items()}
    except (ValueError, TypeError, AttributeError):
        return None


def _event_times(records: list[dict[str, Any]], grain: int) -> EventTimes | None:
    """The messages' own timestamps (event time), counted per bucket of ``grain`` seconds."""
    return EventTimes.counted(((epoch_seconds(r["timestamp"]), 1) for r in records), grain)


def _dump(offsets: dict[int, int]) -> str:
    return dump_cursor({str(p): o for p, o in offsets.items()})


def _offsets(offsets: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))


@dataclass
class _Broker:
    """One short-lived consumer on one topic; every call bounded by ``heartbeat.timeout.s``."""

    product: str
    topic: str
    settings: dict[str, Any]
    #: librdkafka settings over the connection's
    extra: dict[str, Any] = field(default_factory=dict)
    errors: list[KafkaError] = field(default_factory=list)
    consumer: Consumer | None = None

    def __enter__(self) -> _Broker:
        from confluent_kafka import Consumer

        own = _own_settings(self.product, self.settings)
        self.timeout_s, self.max_messages = own.timeout_s, own.max_messages
        config = _consumer_config(self.settings, own, self.errors.append, **self.extra)
        self.where = f"Kafka {self.product}: {self.topic} ({config.get('bootstrap.servers', 'no bootstrap.servers')})"
        try:
            self.consumer = Consumer(config)
        except Exception as exc:  # noqa: BLE001 - bad settings surface as plain exceptions
            raise SourceError(f"{self.where}: {exc}") from exc
        self.deadline = time.monotonic() + self.timeout_s
        return self

    def __exit__(self, *exc: object) -> None:
        if self.consumer is not None:
            self.consumer.close()

    @property
    def client(self) -> Consumer:
        """The consumer, which exists only inside the ``with`` block."""
        if self.consumer is None:
            raise SourceError(f"Kafka {self.product}: {self.topic}: the consumer is used outside its `with` block")
        return self.consumer

    def _remaining(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise SourceError(f"{self.where}: no answer within {self.timeout_s:g}s{self._last_error()}")
        return remaining

    def _last_error(self) -> str:
        return f" (last error: {self.errors[-1].str()})" if self.errors else ""

    def _fail_fast(self) -> None:
        """librdkafka retries forever; give up once it reports every broker down or bad credentials."""
        from confluent_kafka import KafkaError

        self.client.poll(0)  # serves error_cb
        fatal = (KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION)
        for error in self.errors:
            if error.code() in fatal or error.fatal():
                raise SourceError(f"{self.where}: {error.str()}")

    def watermarks(self) -> tuple[dict[int, int], dict[int, int]]:
        """(low, high) offsets of every partition of the topic."""
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        found = self._metadata(self.topic).topics.get(self.topic)
        if found is None or found.error is not None:
            if found is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise SourceError(f"{self.where}: the topic does not exist")
            raise SourceError(f"{self.where}: {found.error.str() if found else 'no metadata for the topic'}")
        low, high = {}, {}
        try:
            for partition in sorted(found.partitions):
                tp = TopicPartition(self.topic, partition)
                low[partition], high[partition] = self.client.get_watermark_offsets(tp, timeout=self._remaining())
        except KafkaException as exc:
            raise SourceError(f"{self.where}: cannot read offsets: {exc.args[0].str()}") from exc
        return low, high

    def _metadata(self, topic: str | None) -> Any:
        """The brokers' metadata of ``topic`` (None: of every topic), retried until the deadline."""
        from confluent_kafka import KafkaException

        while True:
            try:
                return self.client.list_topics(topic, timeout=min(_POLL_S, self._remaining()))
            except KafkaException:
                self._fail_fast()

    def end_offsets(self, topics: Sequence[str]) -> dict[str, dict[int, int]]:
        """The end offset (high watermark) of every partition of ``topics``, in one metadata request and one
        offsets request for all of them. A topic that is missing, or any of whose partitions the brokers
        could not answer for, is left out."""
        from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

        metadata = self._metadata(None)
        asked = [TopicPartition(topic, partition, OFFSET_END) for topic in topics
                 if (found := metadata.topics.get(topic)) is not None and found.error is None
                 for partition in sorted(found.partitions)]
        if not asked:
            return {}
        try:  # offsets_for_times at OFFSET_END is a ListOffsets request for the latest offsets
            answered = self.client.offsets_for_times(asked, timeout=self._remaining())
        except KafkaException as exc:
            raise SourceError(f"{self.where}: cannot read offsets: {exc.args[0].str()}") from exc
        ends: dict[str, dict[int, int]] = {}
        failed = set()
        for tp in answered:
            if tp.error is not None or tp.offset < 0:
                failed.add(tp.topic)
            ends.setdefault(tp.topic, {})[tp.partition] = tp.offset
        return {topic: offsets for topic, offsets in ends.items() if topic not in failed}

    def read(self, start: dict[int, int], end: dict[int, int]) -> tuple[list[dict[str, Any]], dict[int, int]]:
        """Messages in [start, end) per partition, at most ``heartbeat.max.messages``; and the offsets reached."""
        from confluent_kafka import TopicPartition

        todo = {p for p in end if start[p] < end[p]}
        reached = dict(start)
        records: list[dict[str, Any]] = []
        self.client.assign([TopicPartition(self.topic, p, start[p]) for p in todo])
        while todo and len(records) < self.max_messages:
            if time.monotonic() >= self.deadline:
                if records:
                    break  # keep what was read; the next tick resumes from there
                self._remaining()
            # asking for no more than can be left lets consume() return as soon as they are in
            left = max(1, sum(end[p] - reached[p] for p in todo))
            batch = self.client.consume(min(1000, self.max_messages - len(records), left), timeout=_POLL_S)
            for message in batch:
                error = message.error()
                if error is not None:
                    raise SourceError(f"{self.where}: {error.str()}")
                partition, offset = message.partition(), message.offset()
                if partition is None or offset is None:  # set on every message that is not an error
                    raise SourceError(f"{self.where}: a message without partition or offset")
                if partition in todo and offset < end[partition]:
                    records.append(_record(message))
                    reached[partition] = offset + 1
            # Positions also step over offsets that hold no message (transaction markers, compaction).
            for tp in self.client.position([TopicPartition(self.topic, p) for p in todo]):
                if tp.offset >= end[tp.partition]:
                    reached[tp.partition] = end[tp.partition]
                    todo.discard(tp.partition)
        return records, reached


@dataclass(frozen=True)
class _OwnSettings:
    """Heartbeat's own settings of a connection (``heartbeat.*``), the rest being librdkafka's."""

    timeout_s: float
    max_messages: int


def _own_settings(product: str, settings: dict[str, Any]) -> _OwnSettings:
    own = {k: v for k, v in settings.items() if k.startswith("heartbeat.")}
    found = _OwnSettings(float(own.pop("heartbeat.timeout.s", DEFAULT_TIMEOUT_S)),
                         int(own.pop("heartbeat.max.messages", DEFAULT_MAX_MESSAGES)))
    if own:
        raise SourceError(f"kafka.{product}: unknown setting(s) {', '.join(sorted(own))}")
    return found


def _consumer_config(settings: dict[str, Any], own: _OwnSettings, on_error: Any, **extra: Any) -> dict[str, Any]:
    """A consumer's librdkafka config: the connection's settings over Heartbeat's defaults, then ``extra``."""
    return {
        # group.id is mandatory for a consumer; partitions are assigned, so no group is ever joined.
        "group.id": "heartbeat-sensor",
        "enable.auto.commit": False,
        "allow.auto.create.topics": False,
        "socket.connection.setup.timeout.ms": int(own.timeout_s * 1000),
        **{k: v for k, v in settings.items() if not k.startswith("heartbeat.")},
        **extra,
        "error_cb": on_error,
        "logger": log,
    }


class KafkaWatch:
    """Wake-ups for Kafka topics: one consumer per data product, assigned every partition of its watched
    topics at their end, long-polling the brokers (``fetch.wait.max.ms``). A message wakes the sources of its
    topic; its partition is then paused for ``PAUSE_S`` and resumed right after that message, so a message
    that came during the pause wakes them again at once, and a busy topic costs about one small fetch per
    pause, never its traffic (no message is read through, none is kept). Partitions added to a topic later
    wake nothing until the watch is restarted (they are polled). Nothing here raises after ``start``: a broker
    that cannot be reached leaves the topics to polling."""

    #: seconds a partition stays paused after it woke its sources
    PAUSE_S = 1.0

    def __init__(self, products: dict[str, tuple[dict[str, Any], dict[str, frozenset[str]]]],
                 wake: Callable[[str], None]):
        """``products``: per data product, its connection settings and the source keys of each topic."""
        self._products, self._wake = products, wake
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> KafkaWatch:
        for product, (settings, topics) in sorted(self._products.items()):
            thread = threading.Thread(target=self._watch, args=(product, settings, topics),
                                      name=f"heartbeat-kafka-wake-{product}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    def _watch(self, product: str, settings: dict[str, Any], topics: dict[str, frozenset[str]]) -> None:
        from confluent_kafka import Consumer

        try:
            config = _consumer_config(settings, _own_settings(product, settings), lambda error: None,
                                      **{"fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 64,
                                         "max.partition.fetch.bytes": 1024, "queued.min.messages": 1})
            consumer = Consumer(config)
        except Exception as exc:  # noqa: BLE001 - bad settings: sensing reports them; wake-ups are off
            log.info("wake-ups: Kafka %s is polled only: %s", product, exc)
            return
        try:
            consumer.assign(self._at_end(consumer, topics))
            self._consume(consumer, topics)
        except Exception as exc:  # noqa: BLE001 - a broker gone or a topic missing: the topics are polled
            log.info("wake-ups: Kafka %s is polled only: %s", product, exc)
        finally:
            consumer.close()

    def _at_end(self, consumer: Consumer, topics: dict[str, frozenset[str]]) -> list[Any]:
        from confluent_kafka import OFFSET_END, TopicPartition

        metadata = consumer.list_topics(timeout=DEFAULT_TIMEOUT_S)
        return [TopicPartition(topic, partition, OFFSET_END) for topic in sorted(topics)
                if (found := metadata.topics.get(topic)) is not None and found.error is None
                for partition in sorted(found.partitions)]

    def _consume(self, consumer: Consumer, topics: dict[str, frozenset[str]]) -> None:
        from confluent_kafka import OFFSET_END, TopicPartition

        #: paused partitions: until when, and the offset to resume at (after the message that woke them)
        paused: dict[tuple[str, int], tuple[float, int]] = {}
        while not self._stop.is_set():
            message = consumer.poll(0.5)
            now = time.monotonic()
            due = [(tp, after) for tp, (until, after) in paused.items() if until <= now]
            for (done_topic, done_partition), after in due:
                del paused[(done_topic, done_partition)]
                consumer.seek(TopicPartition(done_topic, done_partition, after))
                consumer.resume([TopicPartition(done_topic, done_partition)])
            if message is None or message.error() is not None:
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            for key in topics.get(topic or "", ()):
                self._wake(key)
            if topic is not None and partition is not None:
                consumer.pause([TopicPartition(topic, partition)])
                paused[(topic, partition)] = (now + self.PAUSE_S, OFFSET_END if offset is None else offset + 1)


def _record(message: Any) -> dict[str, Any]:
    _, millis = message.timestamp()
    return {
        "key": _text(message.key()),
        "value": _text(message.value()),
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        # naive UTC: the engine's session time zone is UTC
        "timestamp": datetime.fromtimestamp(millis / 1000, timezone.utc).replace(tzinfo=None) if millis > 0 else None,
    }


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")
