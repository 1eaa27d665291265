"""The pass shapes the vocoder's warm-up captures (``chorus.vocoder.warmup``), from the config alone."""
from __future__ import annotations

from chorus.vocoder import VocoderConfig
from chorus.vocoder.pass_graphs import frame_bucket
from chorus.vocoder.warmup import warmup_shapes


def test_warmup_shapes_of_streams_are_every_window_bucket_at_every_row_bucket():
    shapes = warmup_shapes(VocoderConfig(max_batch_items=4), ratio=2, prompt_tokens=30, chunk_tokens=60,
                           whole_chunk_tokens=None, most_rows=2)
    # windows end at 20 and 60 tokens: flow frames 2 (30 + 23) = 106 and 2 (30 + 63) = 186 -> 128, 192;
    # HiFT spans 2 (20 + 3) + 16 = 62 and 2 (40 + 3) + 16 = 102 -> 64, 128
    assert shapes == [("hift", (1, 64)), ("hift", (2, 64)), ("hift", (1, 128)), ("hift", (2, 128)),
                      ("flow", (1, 128)), ("flow", (2, 128)), ("flow", (1, 192)), ("flow", (2, 192))]


def test_warmup_shapes_of_streams_follow_the_window_growth():
    shapes = warmup_shapes(VocoderConfig(max_batch_items=1, window_growth=4), ratio=2, prompt_tokens=30,
                           chunk_tokens=120, whole_chunk_tokens=None, most_rows=1)
    # windows of 20 and 80 tokens end at 20 and 100: HiFT spans 2 (20 + 3) + 16 = 62 -> 64 and
    # 2 (80 + 3) + 16 = 182 -> 192; flow frames 106 -> 128 and 2 (30 + 103) = 266 -> 320, and the
    # bucket between them (final passes)
    assert shapes == [("hift", (1, 64)), ("hift", (1, 192)),
                      ("flow", (1, 128)), ("flow", (1, 320)), ("flow", (1, 192)), ("flow", (1, 256))]


def test_warmup_shapes_of_whole_chunks_follow_the_streams_at_the_two_largest_row_buckets():
    config, whole = VocoderConfig(), 360
    streams = warmup_shapes(config, 2, 250, 240, None, 32)
    shapes = warmup_shapes(config, 2, 250, 240, whole, 32)
    assert shapes[:len(streams)] == streams and len(set(shapes)) == len(shapes)
    for tokens in range(1, whole + 1):  # every chunk length replays a graph at 16 and 32 rows
        for rows in (16, 32):
            assert ("hift", (rows, frame_bucket(2 * tokens))) in shapes
            assert ("flow", (rows, frame_bucket(2 * (250 + tokens)))) in shapes
    assert {rows for _, (rows, _) in shapes[len(streams):]} == {16, 32}
    assert max(frames for kind, (_, frames) in shapes if kind == "flow") == frame_bucket(2 * (250 + whole))
