"""The pass shapes that :meth:`VocoderStage.warmup` captures CUDA graphs for before serving:
every graph bucket a stream's windows, its final passes and batch work's whole chunks will ask
for, worked out from the stage's config alone (docs/vocoder.md, "CUDA graphs").
"""
from __future__ import annotations

from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.pass_graphs import frame_bucket, row_bucket


def warmup_shapes(cfg: VocoderConfig, ratio: int, prompt_tokens: int, chunk_tokens: int,
                  whole_chunk_tokens: int | None, most_rows: int,
                  silence_tokens: int = 0) -> list[tuple[str, tuple[int, int]]]:
    """The ``("hift" | "flow", (rows, frames))`` shapes :meth:`VocoderStage.warmup` captures, in
    order, each graph bucket once (``ratio``: mel frames per token).

    Streaming passes first: HiFT over the frame buckets of window spans (a window's new frames
    plus the HiFT context), the flow over the frame bucket of the first window (over the prompt
    ``first_window_prompt_tokens`` leaves), then those of the later window ends, then every other
    bucket up to the last window end (final passes land anywhere in between); each at row buckets
    1, 2, 4, ... up to ``most_rows`` (with ``follower_first_window_tokens``, HiFT over a
    follower's first window too). With ``first_window_prompt_tokens`` capping the prompt, the
    flow also over every bucket of a first pass over the capped prompt: one that is also its
    stream's last (a stream of at most its first window's tokens, such as a voice agent's short
    piece: its tokens plus the variant's ``silence_tokens``) and a follower's first window, which
    no later bucket covers. Then, with
    ``whole_chunk_tokens``, non-streaming passes of whole chunks (HiFT over all of a chunk's
    frames, the flow over prompt + chunk) of 1 to ``whole_chunk_tokens`` tokens, at the two
    largest of those row buckets.
    """
    ends, window, windows = [cfg.first_window_tokens], cfg.first_window_tokens, [cfg.first_window_tokens]
    while True:  # window ends as streams advance them (see _advance_window)
        window = cfg.next_window(window)
        if ends[-1] + window > chunk_tokens:
            break
        ends.append(ends[-1] + window)
        windows.append(window)
    first_prompt = prompt_tokens if cfg.first_window_prompt_tokens is None \
        else min(prompt_tokens, cfg.first_window_prompt_tokens)
    later = [ratio * (prompt_tokens + end + cfg.holdback_tokens) for end in ends]
    flow_frames = [ratio * (first_prompt + ends[0] + cfg.holdback_tokens)] + later
    flow_frames += list(range(later[0], later[-1], 64))
    if first_prompt < prompt_tokens:  # a first pass over the capped prompt that is also the last, or a follower's
        longest = max(ends[0], cfg.follower_first_window_tokens or 0) + cfg.holdback_tokens + silence_tokens
        flow_frames += _buckets(ratio * (first_prompt + 1 + silence_tokens), ratio * (first_prompt + longest))
    if cfg.follower_first_window_tokens is not None:  # a follower's first window (uncapped, its flow lies among ``later``'s)
        windows.append(cfg.follower_first_window_tokens)
    hift_frames = [ratio * (w + cfg.holdback_tokens) + cfg.hift_context_frames for w in windows]
    rows = [1]
    while rows[-1] < row_bucket(most_rows):
        rows.append(2 * rows[-1])
    shapes = [("hift", (r, frame_bucket(f))) for f in hift_frames for r in rows]
    shapes += [("flow", (r, frame_bucket(f))) for f in flow_frames for r in rows]
    if whole_chunk_tokens:
        batch_rows = rows[-2:]
        shapes += [("hift", (r, f)) for f in _buckets(ratio, ratio * whole_chunk_tokens) for r in batch_rows]
        shapes += [("flow", (r, f)) for f in _buckets(ratio * (prompt_tokens + 1),
                                                      ratio * (prompt_tokens + whole_chunk_tokens))
                   for r in batch_rows]
    return list(dict.fromkeys(shapes))


def _buckets(low: int, high: int) -> list[int]:
    """Every frame bucket that a count of ``low`` to ``high`` frames falls in, in order."""
    return list(dict.fromkeys(frame_bucket(f) for f in range(low, high + 1)))
