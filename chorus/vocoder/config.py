"""Configuration, outputs and counters of the vocoder stage."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from chorus.triton_backend import BACKENDS


@dataclass(frozen=True)
class VocoderConfig:
    """How the vocoder stage cuts streams into windows and groups work into passes.

    Windows are counted in usable speech tokens (after the variant's clean-up); 25 tokens are one
    second of audio, one token is two mel frames, one mel frame is 480 samples at 24 kHz.
    """

    first_window_tokens: int = 20
    """Tokens a stream needs (beyond the held-back ones) before its first pass: small means a
    short time to first audio."""
    follower_first_window_tokens: int | None = None
    """The first window of a *follower*: a stream added while its listener still has audio ahead
    of it to hear (a streamed request's later chunk, a voice-agent turn's later piece while the
    earlier one plays; docs/vocoder.md, "Listeners"). None (the default): ``first_window_tokens``
    like every stream. Larger means fewer passes per follower, each re-reading the voice prompt
    (a piece of 80 tokens takes one pass at 100 instead of three at 20, 60 and 80), at the
    price of its first audio needing more of T3's tokens, which the audio ahead of it has to
    cover. Whether a stream is a follower depends on when it is added (a piece added after the
    earlier one was heard to the end is not), so with this set a later piece's window
    boundaries, and so its audio to within the cross-fades, can differ between runs."""
    max_window_tokens: int = 100
    """Later windows grow from ``first_window_tokens`` by ``window_growth`` up to this many tokens."""
    window_growth: int = 2
    """Each window of a stream is this many times the one before (up to ``max_window_tokens``):
    2 gives 20, 40, 80, 100, 100 ... Every window is a pass that re-reads the voice prompt, so
    faster growth means fewer passes per stream and less flow work; the next window then needs
    more of T3's tokens before it can run (docs/vocoder.md, "Windows")."""
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
    first_window_prompt_tokens: int | None = None
    """A stream's passes before its first audio (its first window) use only the last this many
    tokens of the voice's S3Gen prompt (and their mel frames, as ``prompt_tokens`` cuts them; the
    smaller of the two caps holds); later passes use the prompt as ``prompt_tokens`` leaves it.
    None (the default): every pass uses the same prompt. A first window reads 20 new tokens
    beside the 250 of a 10 s prompt, so the prompt is most of the flow's work in the pass that
    decides a stream's time to first audio; capping it there shortens that pass at the price of
    less voice context for the stream's first second of audio, which is cross-faded into the
    next window as any window boundary is. Non-streaming jobs are not affected
    (docs/vocoder.md, "First-window prompt")."""
    batching: Literal["fifo", "length"] = "length"
    """Which ready jobs share a pass: ``fifo`` takes them oldest first; ``length`` starts from
    the oldest and adds the jobs closest in length (less padding)."""
    playback_margin_s: float = 1.0
    """Passes go earliest deadline first; a playing stream is due this many seconds before its
    listener would run out of audio, so streams that have started keep this much in hand before
    new streams get their first audio (a stall is worse than a later start)."""
    max_pass_seconds: float | None = None
    """While streams are running, a pass is filled only while its predicted device time (from
    earlier passes, ``VocoderStage.cost``) stays under this many seconds, or under the time until
    the most urgent playing stream runs out of audio if that is sooner (but never under half of
    this): a stream that arrives during a pass waits at most about this long for its first
    window, and passes end before playing streams run dry. The most urgent job always runs.
    None (the default): no time budget (passes without streams never have one). With a budget,
    which streams share a pass follows measured times, so a stream's audio can differ between
    runs in the last bits (batch mates change kernels' rounding); without one, passes are a
    function of the tokens. Measured on an H200 (docs/vocoder.md, "Pass sizing")."""
    voice_cache_size: int = 16
    """Voices whose prompt tensors are kept on the device (LRU)."""
    cuda_graphs: bool = True
    """On a CUDA device, run a pass's flow (encoder and solver) and its HiFT as two captured CUDA
    graphs per shape bucket instead of launching their kernels one by one from Python
    (``chorus.vocoder.pass_graphs``; docs/vocoder.md). Off, or on the CPU, passes run eagerly."""
    max_pass_graphs: int = 96
    """Captured graphs kept at once, of each kind (flow, HiFT; least recently used dropped first).
    Each holds its static inputs and outputs on the device; intermediates share one pool."""
    max_graph_rows: int = 32
    """Passes of more items than this run eagerly."""
    capture_after: int = 3
    """A shape bucket that warm-up did not capture is captured on its ``capture_after``-th use
    (eager before that): rare shapes never pay a capture (0.1-1 s each, the GIL held), frequent
    ones do once. A shape that a held graph covers (``graph_cover_work``) is not captured in a
    pass then but when the stage is next idle (``covered_capture_after``)."""
    graph_cover_work: float | None = 4.0
    """A shape with no graph of its own (until it is captured, see ``covered_capture_after``, or
    when its capture failed) replays the held graph of at least its rows and frames with the least padded work
    (rows x frames), if that is at most this many times its own bucket's; otherwise it runs
    eagerly. Padding changes no valid value, so this trades padded work (at most this factor;
    attention grows faster in frames) for eager launches (on an H200 an eager flow call of a
    whole-chunk pass took 2.3 s against 0.13-0.15 s replayed), and covers what warm-up's plan
    cannot: a voice prompt shorter than warm-up's 10 s, a final pass's short tail. None: such
    calls run eagerly (docs/vocoder.md, "CUDA graphs of the whole pass")."""
    covered_capture_after: int | None = 50
    """A shape that replays a covering graph and has been used ``capture_after`` times gets its
    own graph when the stage holds no job (no stream waits while it is captured), or at the latest
    in the pass of its ``covered_capture_after``-th use, so a server that is never idle still
    captures its frequent shapes once. None: only when idle. Measured on an H200 before this
    rule: a server over a 5.7 s voice clip captured 12 graphs mid-serving, about 0.5 s each with
    every stream waiting (docs/vocoder.md, "CUDA graphs of the whole pass")."""
    compile_hift: bool = False
    """Run HiFT's decoder (``HiFTGenerator.decode``: its convolutions and the many small kernels
    around them, Snake activations, masks, residual adds) through ``torch.compile`` with dynamic
    shapes, in graphed and eager passes alike; ``VocoderStage.warmup`` compiles it before serving.
    Off by default: on an H200 the compiled decoder alone took 59 ms against 140 ms eagerly (32
    items of 500 frames, bf16), but end to end (``chorus bench offline``, turbo) it gained 3-5%,
    within run-to-run spread, for about 90 s more start-up (docs/vocoder.md, "Compiled HiFT")."""
    hift_ops: str = "auto"
    """The kernels of HiFT's Snake activations (``HiFTGenerator.ops_backend``): ``"auto"`` runs
    each Snake, with the mask before it, as one Triton kernel on CUDA and the plain tensor ops
    elsewhere; ``"torch"`` the plain ops everywhere; ``"triton"`` requires the kernel. The kernel
    rounds where the plain ops round, so the audio is the same to within fp32's last bit of a
    sine (docs/vocoder.md, "Fused Snake")."""
    flow_ops: str = "auto"
    """The kernels of the flow estimator's norms (``ConditionalDecoder.ops_backend``): each causal
    block's LayerNorm + Mish + mask (with the add after it) and each transformer block's residual
    add + LayerNorm. ``"auto"`` (default) runs each as one Triton kernel on CUDA and the plain
    tensor ops elsewhere; ``"torch"`` the plain ops everywhere, exactly as before the kernels
    existed; ``"triton"`` requires the kernels. On an H200 the kernels made a pass 1.12-1.24x
    faster; they round where the plain ops round, so bf16 audio is as close to fp32 with them as
    without, but not bitwise the plain ops' (docs/vocoder.md, "Fused flow norms")."""
    encoder_attention_ops: str = "torch"
    """The kernel of the flow encoder's relative-position attention
    (``UpsampleConformerEncoder.ops_backend``): ``"torch"`` (default) builds the position term as
    tensors and runs SDPA with it as a float bias, exactly as before the kernel existed;
    ``"auto"`` runs one Triton flash-attention kernel that computes the position term per tile on
    CUDA (the plain ops elsewhere); ``"triton"`` requires the kernel. Opt-in: the kernel is not
    measured on a GPU yet, so it is not on by default (docs/vocoder.md, "Fused encoder
    attention")."""

    def __post_init__(self) -> None:
        if self.first_window_tokens < 1 or self.max_window_tokens < self.first_window_tokens:
            raise ValueError("need 1 <= first_window_tokens <= max_window_tokens")
        _check_optional_int("follower_first_window_tokens", self.follower_first_window_tokens, 1,
                            "first_window_tokens")
        if (self.follower_first_window_tokens or 0) > self.max_window_tokens:
            raise ValueError(f"follower_first_window_tokens must be at most max_window_tokens "
                             f"({self.max_window_tokens}), got {self.follower_first_window_tokens}")
        if isinstance(self.window_growth, bool) or not isinstance(self.window_growth, int) or self.window_growth < 1:
            raise ValueError(f"window_growth must be an int >= 1, got {self.window_growth!r}")
        if self.max_pass_seconds is not None and not self.max_pass_seconds > 0:
            raise ValueError(f"max_pass_seconds must be > 0 or None, got {self.max_pass_seconds!r}")
        if not self.playback_margin_s >= 0:
            raise ValueError(f"playback_margin_s must be >= 0, got {self.playback_margin_s!r}")
        if self.max_batch_items < 1 or self.max_batch_tokens < 1:
            raise ValueError("max_batch_items and max_batch_tokens must be positive")
        if self.holdback_tokens < 1:
            raise ValueError("holdback_tokens must be >= 1")
        if not 0 <= self.crossfade_frames <= self.hift_context_frames:
            raise ValueError("need 0 <= crossfade_frames <= hift_context_frames")
        _check_optional_int("stream_context_tokens", self.stream_context_tokens, 0, "unbounded")
        _check_optional_int("prompt_tokens", self.prompt_tokens, 1, "the whole voice prompt")
        _check_optional_int("first_window_prompt_tokens", self.first_window_prompt_tokens, 1,
                            "the same prompt as later windows")
        if self.voice_cache_size < 1:
            raise ValueError(f"voice_cache_size must be positive, got {self.voice_cache_size}")
        if self.max_graph_rows < 1 or self.capture_after < 1:
            raise ValueError("max_graph_rows and capture_after must be >= 1")
        _check_optional_int("covered_capture_after", self.covered_capture_after, 1, "captured only when idle")
        if self.graph_cover_work is not None and (isinstance(self.graph_cover_work, bool)
                                                  or not isinstance(self.graph_cover_work, (int, float))
                                                  or not self.graph_cover_work >= 1):
            raise ValueError(f"graph_cover_work must be None (shapes without a graph run eagerly) or a "
                             f"number >= 1, got {self.graph_cover_work!r}")
        if self.max_pass_graphs < 1:
            raise ValueError(f"max_pass_graphs must be >= 1, got {self.max_pass_graphs}")
        if not isinstance(self.compile_hift, bool):
            raise ValueError(f"compile_hift must be True or False, got {self.compile_hift!r}")
        if self.hift_ops not in BACKENDS:
            raise ValueError(f"hift_ops must be one of {BACKENDS}, got {self.hift_ops!r}")
        if self.flow_ops not in BACKENDS:
            raise ValueError(f"flow_ops must be one of {BACKENDS}, got {self.flow_ops!r}")
        if self.encoder_attention_ops not in BACKENDS:
            raise ValueError(f"encoder_attention_ops must be one of {BACKENDS}, got {self.encoder_attention_ops!r}")
        if self.batching not in ("fifo", "length"):
            raise ValueError(f"batching must be 'fifo' or 'length', got {self.batching!r}")

    def next_window(self, window: int) -> int:
        """The size of a stream's window after one of ``window`` tokens."""
        return min(self.window_growth * window, self.max_window_tokens)


def _check_optional_int(name: str, value: object, minimum: int, none_means: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be None ({none_means}) or an int >= {minimum}, got {value!r}")


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
    """Cumulative work of a stage. ``flow_seconds`` and ``hift_seconds`` are device time (CUDA
    events on the stage's stream; host time on the CPU); ``total_seconds`` is host wall time of
    the passes."""

    passes: int = 0
    items: int = 0
    failed_passes: int = 0
    audio_seconds: float = 0.0
    flow_seconds: float = 0.0
    """The flow: encoder and flow-matching solver (one graph replay when graphed)."""
    hift_seconds: float = 0.0
    total_seconds: float = 0.0
    padded_tokens: int = 0
    """Sum over passes of items x longest (prompt + tokens): the flow's padded work."""
    real_tokens: int = 0
    """Sum over passes of each item's prompt + tokens."""
    graph_replays: int = 0
    """Flow or HiFT calls run by replaying a captured CUDA graph (their own or a covering one)."""
    covered_replays: int = 0
    """Of those, calls that replayed a larger graph (``graph_cover_work``): their shape had none."""
    graph_captures: int = 0
    """Graphs captured (at warm-up, on a shape's ``capture_after``-th use, or for a covered shape
    when the stage is idle or on its ``covered_capture_after``-th use)."""
    graph_capture_seconds: float = 0.0
    """Wall time spent capturing them (each capture includes an eager run first)."""
    eager_runs: int = 0
    """Flow or HiFT calls run eagerly (CPU, graphs off, too many rows, a shape not captured yet)."""
