"""The garbage collector's pauses (chorus/gc_pauses.py): timed by generation, kept short
by the frozen start-up heap, and exported by a live server with its event-loop lag."""
from __future__ import annotations

import gc
import weakref

import pytest

from chorus import gc_pauses
from tests.server.live import LiveServer, metric, server_config, tiny_loader, until

pytestmark = pytest.mark.timeout(120)


class _Node:
    pass


def test_a_full_collection_is_timed_by_generation_until_the_watch_stops():
    watch = gc_pauses.PauseWatch()
    watch.start()
    gc.collect()
    watch.stop()
    gc.collect()  # not seen
    pauses: list[tuple[int, float]] = []
    watch.drain(lambda generation, seconds: pauses.append((generation, seconds)))
    assert [g for g, _ in pauses if g == 2] == [2] and all(s >= 0 for _, s in pauses)
    watch.drain(lambda *pause: pauses.append(pause))  # drained: nothing twice
    assert len([g for g, _ in pauses if g == 2]) == 1


def test_a_frozen_cycle_waits_for_collect_everything():
    node = _Node()
    node.itself = node
    alive = weakref.ref(node)
    try:
        gc_pauses.freeze()
        assert gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert alive() is not None  # frozen: the collector does not look at it
        gc_pauses.collect_everything()
        assert alive() is None and gc.get_freeze_count() > 0  # collected, the survivors frozen again
    finally:
        gc_pauses.thaw()
    assert gc.get_freeze_count() == 0


def test_a_ready_server_has_frozen_its_heap_and_exports_loop_lag_and_gc_pauses(tmp_path):
    config = server_config(tmp_path, canary_interval_s=3600.0)
    with LiveServer(config, tiny_loader(config)) as server:
        assert gc.get_freeze_count() > 0
        gc.collect()  # a full collection, timed by the server's watch

        def exported() -> bool:
            text = server.client.get("/metrics").text
            return (metric(text, "chorus_event_loop_lag_seconds_count") > 0
                    and metric(text, "chorus_gc_pause_seconds_count", 'generation="2"') > 0)

        until(exported, what="the loop lag and a full collection's pause on /metrics")
    assert gc.get_freeze_count() == 0  # stopped: the heap is the collector's again


def test_gc_freeze_off_leaves_the_heap_to_the_collector(tmp_path):
    config = server_config(tmp_path, canary_interval_s=3600.0, gc_freeze=False)
    with LiveServer(config, tiny_loader(config)):
        assert gc.get_freeze_count() == 0
