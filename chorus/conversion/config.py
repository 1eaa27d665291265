"""Limits of voice conversion (one typed config, shared by the pipeline, the CLI and, later, the
server)."""
from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAX_SOURCE_S = 60.0
MIN_SOURCE_S = 0.1  # 2.5 speech tokens: anything shorter has nothing to convert


@dataclass(frozen=True)
class ConversionConfig:
    """max_source_s: the longest source clip accepted, in seconds; a longer one is refused
    (``SourceAudioError`` with reason ``too_long``, HTTP 413), judged from the file's header when
    it states a length, else while decoding, which stops just past the limit. 60 s by default:
    two windows of the S3 tokenizer (it works in 30 s windows with 4 s overlap) and, for a
    non-streamed conversion, one S3Gen pass of at most 1,500 source tokens beside the voice's
    250-token prompt (the flow attends over all of them at once, so its memory grows with the
    square of the length); a streamed conversion's passes stay bounded by the vocoder's windows.
    min_source_s: the shortest source accepted (reason ``too_short``)."""

    max_source_s: float = DEFAULT_MAX_SOURCE_S
    min_source_s: float = MIN_SOURCE_S

    def __post_init__(self) -> None:
        for name in ("max_source_s", "min_source_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.min_source_s > self.max_source_s:
            raise ValueError(f"min_source_s ({self.min_source_s:g}) must not exceed max_source_s "
                             f"({self.max_source_s:g})")
