"""Configuration, outputs and counters of the vocoder stage."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class VocoderConfig:
    """How the vocoder stage cuts streams into windows and groups work into passes.

    Windows are counted in usable speech tokens (after the variant's clean-up); 25 tokens are one
    second of audio, one token is two mel frames, one mel frame is 480 samples at 24 kHz.
    """

    first_window_tokens: int = 20
    """Tokens a stream needs (beyond the held-back ones) before its first pass: small means a
    short time to first audio."""
    max_window_tokens: int = 100
    """Later windows double from ``first_window_tokens`` up to this many tokens."""
    max_batch_items: int = 32
    """Items (jobs) in one batched pass."""
    max_batch_tokens: int = 16384
    """Padded token budget of one pass: items x longest (prompt + tokens). One item always fits."""
    holdback_tokens: int = 3
    """Right context of a window: the mel of the last ``holdback_tokens`` tokens is not vocoded
    until more tokens arrive (the encoder's pre-lookahead conv sees 3 future tokens; the flow's
    attention sees everything). At least 1, so the multilingual tail cut never meets sent audio."""
    hift_context_frames: int = 16
    """Mel frames of left context HiFT re-reads before a window's new frames."""
    crossfade_frames: int = 4
    """Mel frames (480 samples each) of audio held back at a window's end and cross-faded with
    the next window's audio of the same frames. At most ``hift_context_frames``."""
    stream_context_tokens: int | None = 100
    """Left-context cap of a stream's passes (None: unbounded, every token so far). A pass's flow
    reads the prompt, at most this many tokens before the first token its HiFT re-reads
    (``hift_context_frames``), then the window and its held-back tokens; earlier tokens are left
    out, so a pass's cost stops growing with the stream (linear total cost instead of quadratic).
    Every frame keeps the noise of its absolute position. Non-streaming jobs are not affected.
    100 tokens (4 s): on random weights the audio SNR against one pass does not change and the
    mel SNR of 400-token streams stays within 1.2 dB of unbounded (docs/vocoder.md, "Left context
    and prompt length")."""
    prompt_tokens: int | None = None
    """Use only the last this many tokens of each voice's S3Gen prompt (None: the whole prompt,
    the reference behaviour) and the prompt-mel frames that belong to them: with ``d`` tokens
    dropped from the start, the mel's first ``2 d`` frames go too, so frames ``2 t`` and
    ``2 t + 1`` stay those of token ``t`` and an odd last frame (``Tm = 2 Tp +- 1``) stays at the
    end. Shortens every pass's flow (streams and non-streaming jobs alike) at the price of less
    voice context; it changes the audio of every job against the reference
    (docs/vocoder.md, "Left context and prompt length")."""
    noise_block_frames: int = 50
    """Streams draw their noise in blocks of this many frames, so the noise of a frame does not
    depend on how the stream was cut into windows."""
    batching: Literal["fifo", "length"] = "length"
    """Which ready jobs share a pass: ``fifo`` takes them oldest first; ``length`` starts from
    the oldest and adds the jobs closest in length (less padding)."""
    playback_margin_s: float = 1.0
    """Passes go earliest deadline first; a playing stream is due this many seconds before its
    listener would run out of audio, so streams that have started keep this much in hand before
    new streams get their first audio (a stall is worse than a later start)."""
    voice_cache_size: int = 16
    """Voices whose prompt tensors are kept on the device (LRU)."""
    time_stages: bool = True
    """Time the flow encoder separately (adds device synchronisations on GPU)."""
    cuda_graphs: bool = True
    """On a CUDA device, run the flow-matching solver (every Euler step and the CFG combine) as
    one captured CUDA graph per shape bucket instead of launching its kernels one by one from
    Python (``chorus.vocoder.solver_graphs``; docs/vocoder.md). Off, or on the CPU, the solver
    runs eagerly."""
    max_solver_graphs: int = 64
    max_graph_rows: int = 8
    """Solves of more items than this run eagerly: a batch that large is compute bound and a graph
    does not pay (measured on an H200: 1.5-3.8x faster up to 8 items, about 1.0x at 32;
    docs/vocoder.md)."""
    capture_after: int = 3
    """A shape bucket that warm-up did not capture is captured on its ``capture_after``-th solve
    (eager before that): rare shapes never pay a capture (0.1-0.6 s each, the GIL held), frequent
    ones do once."""
    """Captured solver graphs kept at once (least recently used dropped first); each holds its
    static inputs and output on the device, so this bounds what the graphs hold besides the
    shared memory pool of their intermediates."""

    def __post_init__(self) -> None:
        if self.first_window_tokens < 1 or self.max_window_tokens < self.first_window_tokens:
            raise ValueError("need 1 <= first_window_tokens <= max_window_tokens")
        if not self.playback_margin_s >= 0:
            raise ValueError(f"playback_margin_s must be >= 0, got {self.playback_margin_s!r}")
        if self.max_batch_items < 1 or self.max_batch_tokens < 1:
            raise ValueError("max_batch_items and max_batch_tokens must be positive")
        if self.holdback_tokens < 1:
            raise ValueError("holdback_tokens must be >= 1")
        if not 0 <= self.crossfade_frames <= self.hift_context_frames:
            raise ValueError("need 0 <= crossfade_frames <= hift_context_frames")
        if self.stream_context_tokens is not None and (
                isinstance(self.stream_context_tokens, bool) or not isinstance(self.stream_context_tokens, int)
                or self.stream_context_tokens < 0):
            raise ValueError(f"stream_context_tokens must be None (unbounded) or an int >= 0, "
                             f"got {self.stream_context_tokens!r}")
        if self.prompt_tokens is not None and (
                isinstance(self.prompt_tokens, bool) or not isinstance(self.prompt_tokens, int)
                or self.prompt_tokens < 1):
            raise ValueError(f"prompt_tokens must be None (the whole voice prompt) or an int >= 1, "
                             f"got {self.prompt_tokens!r}")
        if self.noise_block_frames < 1 or self.voice_cache_size < 1:
            raise ValueError("noise_block_frames and voice_cache_size must be positive")
        if self.max_graph_rows < 1 or self.capture_after < 1:
            raise ValueError("max_graph_rows and capture_after must be >= 1")
        if self.max_solver_graphs < 1:
            raise ValueError(f"max_solver_graphs must be >= 1, got {self.max_solver_graphs}")
        if self.batching not in ("fifo", "length"):
            raise ValueError(f"batching must be 'fifo' or 'length', got {self.batching!r}")


@dataclass
class AudioOut:
    """The next piece of one job's audio, as returned by :meth:`VocoderStage.step`."""

    job_id: str
    samples: torch.Tensor
    """1-D float32 CPU samples at 24 kHz, following the job's previous piece."""
    final: bool
    """True on the job's last piece: its audio is complete and the stage forgot the job."""
    error: str | None = None
    """Set when the job failed (then ``final`` is True and ``samples`` empty)."""


@dataclass
class VocoderStats:
    """Cumulative work of a stage. Seconds are wall time on the host (the device is synchronised
    around each part when ``VocoderConfig.time_stages``)."""

    passes: int = 0
    items: int = 0
    failed_passes: int = 0
    audio_seconds: float = 0.0
    flow_encoder_seconds: float = 0.0
    flow_decoder_seconds: float = 0.0
    hift_seconds: float = 0.0
    total_seconds: float = 0.0
    padded_tokens: int = 0
    """Sum over passes of items x longest (prompt + tokens): the flow's padded work."""
    real_tokens: int = 0
    """Sum over passes of each item's prompt + tokens."""
    graph_replays: int = 0
    """Flow-matching solves run by replaying a captured CUDA graph."""
    graph_captures: int = 0
    """Solver graphs captured (at warm-up or on a pass's first use of a shape bucket)."""
    graph_capture_seconds: float = 0.0
    """Wall time spent capturing them (each capture includes a warm-up solve)."""
    eager_solves: int = 0
    """Flow-matching solves run eagerly (CPU, graphs off, or a shape whose capture failed)."""
