"""The progress feed reads each update from the JVM once: one `lastProgress` per look, and
`recentProgress` only when it may have missed an update."""

from fissure.spark.query.progress_feed import KEPT_UPDATES, ProgressFeed


class CountingQuery:
    """A query whose progress is a list the test appends to; counts what the feed reads."""

    def __init__(self) -> None:
        self.progress: list[dict] = []
        self.last_reads = 0
        self.recent_reads = 0

    def finish(self, batch_id: int, timestamp: str | None = None) -> None:
        self.progress.append({"batchId": batch_id, "timestamp": timestamp or f"t{batch_id}"})

    @property
    def lastProgress(self):
        self.last_reads += 1
        return self.progress[-1] if self.progress else None

    @property
    def recentProgress(self):
        self.recent_reads += 1
        return list(self.progress[-KEPT_UPDATES:])


def batch_ids(updates) -> list[int]:
    return [update["batchId"] for update in updates]


def test_one_batch_at_a_time_reads_only_the_last_update():
    query = CountingQuery()
    feed = ProgressFeed(lambda: query)
    assert feed.updates() == []
    query.finish(0)
    assert batch_ids(feed.updates()) == [0]  # a new query: Spark's kept updates read once
    assert query.recent_reads == 1
    for batch in range(1, 50):
        query.finish(batch)
        assert batch_ids(feed.newer_than(batch - 1)) == [batch]
        assert batch_ids(feed.newer_than(batch - 1)) == [batch]  # a second look reads nothing new
    assert query.recent_reads == 1
    assert batch_ids(feed.updates()) == list(range(50))


def test_missed_batches_are_read_from_the_kept_updates_in_order():
    query = CountingQuery()
    feed = ProgressFeed(lambda: query)
    query.finish(0)
    feed.updates()
    for batch in (1, 2, 3):
        query.finish(batch)
    assert batch_ids(feed.newer_than(0)) == [1, 2, 3]
    assert query.recent_reads == 2


def test_an_idle_update_repeating_a_batch_id_is_kept_once_each():
    query = CountingQuery()
    feed = ProgressFeed(lambda: query)
    query.finish(0)
    query.finish(1)
    feed.updates()
    query.finish(1, "idle")
    assert [(u["batchId"], u["timestamp"]) for u in feed.updates()] == [(0, "t0"), (1, "t1"), (1, "idle")]
    assert feed.updates()[-1]["timestamp"] == "idle"


def test_a_replaced_query_is_read_whole_and_earlier_updates_stay():
    first, second = CountingQuery(), CountingQuery()
    current = [first]
    feed = ProgressFeed(lambda: current[0])
    first.finish(0)
    first.finish(1)
    feed.updates()
    current[0] = second  # a restart on the same checkpoint replays batch 1, then goes on
    second.finish(1, "replayed")
    second.finish(2)
    assert [(u["batchId"], u["timestamp"]) for u in feed.updates()] == [
        (0, "t0"), (1, "t1"), (1, "replayed"), (2, "t2")]
    assert second.recent_reads == 1


def test_the_feed_keeps_as_many_updates_as_spark_does():
    query = CountingQuery()
    feed = ProgressFeed(lambda: query)
    for batch in range(KEPT_UPDATES + 30):
        query.finish(batch)
        feed.updates()
    assert batch_ids(feed.updates()) == list(range(30, KEPT_UPDATES + 30))


def test_no_query_yet_gives_nothing():
    feed = ProgressFeed(lambda: None)
    assert feed.updates() == [] and feed.newer_than(-1) == []
