"""The speech pipeline's settings: the T3 engine's and the vocoder stage's configs, chunking,
default deadlines, how the two stage threads share a CPU, voice conversion's limits and warm-up."""
from __future__ import annotations

from dataclasses import dataclass, field

from chorus.conversion.config import ConversionConfig
from chorus.engine.config import EngineConfig
from chorus.text import DEFAULT_MAX_CHARS
from chorus.vocoder.config import VocoderConfig


@dataclass(frozen=True)
class PipelineConfig:
    """engine: the T3 engine (its ``default_deadline_s`` is overridden: the pipeline owns a
    request's deadlines, which cover T3 and S3Gen). vocoder: the S3Gen stage.
    max_chars: chunk length bound.
    default_deadline_s: the total deadline of requests that bring none (submission to the
    end); None = none (batch jobs). default_start_deadline_s: the start deadline of requests
    that bring none (submission to the first audio piece); None = none.
    split_cpu_threads: on a CPU, give the T3 thread and the vocoder thread each a share of
    torch's intra-op threads (T3 the larger half, at least one each) instead of both using all
    of them: two stages running parallel ops at once on the same cores oversubscribe them, and
    OpenMP's spinning workers then slow both (docs/engine.md, "Step time"). No effect on a GPU.
    conversion: the limits of voice conversion (``Pipeline.convert``).
    warmup: warm the vocoder up (:meth:`Pipeline.warmup`) while constructing, before the T3
    engine is built: on CUDA the engine sizes its KV pool to ``gpu_memory_utilization`` of the
    device less what is held, so graphs captured first keep their memory, while graphs captured
    after must fit in what the pool leaves (on an 80 GB card, too little for the largest vocoder
    shapes at the server's default). ``chorus serve`` sets it unless ``--no-warmup``.
    """

    engine: EngineConfig | None = None
    vocoder: VocoderConfig | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    default_deadline_s: float | None = None
    default_start_deadline_s: float | None = None
    conditioning_cache_size: int = 256
    cuda_graphs: bool = True
    split_cpu_threads: bool = True
    conversion: ConversionConfig = field(default_factory=ConversionConfig)
    warmup: bool = False
