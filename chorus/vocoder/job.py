"""One vocoder job: its tokens as they arrive, its randomness and, for a stream, what was sent.

A stream's audio timeline is the one-pass waveform of all its tokens: sample ``s`` belongs to mel
frame ``s // 480`` of the new (non-prompt) frames. Each pass vocodes mel frames
``[hift_start, mel_end)`` and yields audio for samples ``[480 hift_start, 480 mel_end)``; the job
has sent samples ``[0, sent)`` and holds ``tail``, the previous pass's audio of
``[sent, sent + len(tail))``, which is cross-faded into the next pass's audio of the same samples.

With a left-context cap (``VocoderConfig.stream_context_tokens``) a pass's flow reads the prompt and
the job's tokens from ``FlowWindow.first_token`` on, not from the first token; its mel frame ``i``
is then the stream's new frame ``i + FlowWindow.frame_offset`` (see :class:`FlowWindow`).
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from chorus.models.s3gen.s3gen import SAMPLE_RATE, SAMPLES_PER_TOKEN, SILENCE_TOKEN, TokenRules
from chorus.sampling.counter_rng import mix32, seed_lanes_of
from chorus.triton_backend import use_triton_on
from chorus.voices import S3GenPrompt

logger = logging.getLogger(__name__)

SAMPLES_PER_FRAME = 480


class NoiseTape:
    """Standard-normal noise ``[rows, columns]`` addressed by absolute column, computed where it is
    used (on the job's device) from a counter-based hash of (seed, row, column).

    A value depends only on those three numbers: not on which slices were asked for before, not on
    the device (integer hashing is exact; the float conversion differs between devices by at
    most a few ulps), and it needs no generator state, so a pass asks for exactly the columns it
    vocodes. Uniforms from two hash lanes become normals by the Box-Muller transform.

    Making one is host work in numpy alone, no tensor call: streams are added on the vocoder
    thread, and each tensor call there gives the GIL away to T3's thread, which may keep it for a
    switch interval (measured on an H200: 64 streams added at once held their first pass back
    by about 0.24 s while each tape's row keys were made and copied with tensor calls). The keys
    reach the device with the first read (:func:`read_tapes`: one copy for a pass's tapes).
    """

    def __init__(self, rows: int, seed: int, device: torch.device, dtype: torch.dtype = torch.float32):
        self.lanes = seed_lanes_of(seed % 2**64)
        self.rows, self.device, self.dtype = rows, device, dtype
        keys = [mix32(lane ^ row_hash) for lane, row_hash in zip(self.lanes, _row_hashes(rows))]
        self.row_keys = np.stack(keys, axis=1)  # [rows, 2] int64, on the host

    def slice(self, start: int, end: int) -> torch.Tensor:
        """Columns ``[start, end)``: ``[rows, end - start]``."""
        assert 0 <= start <= end, (start, end)
        columns = torch.arange(start, end, dtype=torch.int64, device=self.device)[None, :]
        return _normals(columns, torch.from_numpy(self.row_keys).to(self.device)).to(self.dtype)


ColumnRanges = Sequence[tuple[int, int]]
"""An item's columns of its tape: ``(start, end)`` ranges, laid out one after another."""

_TAPE_KERNELS = "chorus.vocoder.triton_tapes"


def read_tapes(tapes: Sequence[NoiseTape], ranges: Sequence[ColumnRanges], width: int, *,
               backend: str = "auto") -> torch.Tensor:
    """Item ``i``'s noise at the columns ``ranges[i]`` of ``tapes[i]``: ``[len(tapes), rows,
    width]``, zero past each item's columns. The values are those of :meth:`NoiseTape.slice`:
    bit for bit on the PyTorch path, where one pass's items share one set of kernels (in groups
    of at most ``READ_GROUP_ELEMENTS`` values) instead of a set per item; on CUDA one Triton
    kernel computes the same function (``triton_tapes``, at most two ranges per item; equal to
    the PyTorch path on the same device). ``backend``: ``"auto"`` (the kernel for CUDA tapes),
    ``"triton"`` or ``"torch"`` (:mod:`chorus.triton_backend`). The tapes must agree in rows,
    dtype and device."""
    first = tapes[0]
    assert all((t.rows, t.dtype, t.device) == (first.rows, first.dtype, first.device) for t in tapes)
    assert len(ranges) == len(tapes)
    if use_triton_on(backend, first.device, _TAPE_KERNELS, "noise tape"):
        from chorus.vocoder.triton_tapes import read_tapes_triton

        return read_tapes_triton([t.row_keys for t in tapes], ranges, width, first.dtype, first.device)
    index = np.zeros((len(tapes), width), np.int64)
    valid = np.zeros((len(tapes), width), bool)
    for i, item_ranges in enumerate(ranges):
        columns = np.concatenate([np.arange(a, b) for a, b in item_ranges]) if item_ranges else index[i, :0]
        assert len(columns) <= width, (len(columns), width)
        index[i, :len(columns)], valid[i, :len(columns)] = columns, True
    index_d = torch.from_numpy(index).to(first.device)[:, None, :]
    valid_d = torch.from_numpy(valid).to(first.device)[:, None, :]
    keys = torch.from_numpy(np.stack([t.row_keys for t in tapes])).to(first.device)  # [items, rows, 2]
    out = torch.empty(len(tapes), first.rows, width, dtype=first.dtype, device=first.device)
    group = max(1, READ_GROUP_ELEMENTS // max(1, first.rows * width))
    for g in range(0, len(tapes), group):
        part = slice(g, g + group)
        out[part] = torch.where(valid_d[part], _normals(index_d[part], keys[part]), 0.0).to(first.dtype)
    return out


# Values one read_tapes kernel set computes at most (its int64 temporaries: 32 MiB each).
READ_GROUP_ELEMENTS = 1 << 22


def _normals(columns: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    """float32 standard normals of the columns (int64 ``[..., 1, W]``) under the row keys
    (``[..., rows, 2]``): ``[..., rows, W]``."""
    hashed = mix32(columns)
    first = mix32(hashed ^ row_keys[..., :1])
    second = mix32(hashed ^ row_keys[..., 1:])
    u1 = (first.to(torch.float32) + 0.5) * 2.0 ** -32  # in (0, 1]: log never sees 0
    u2 = second.to(torch.float32) * 2.0 ** -32
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2 * math.pi) * u2)


_ROW_SALTS = (0x165667B1, 0xD3A2646C)


@functools.lru_cache(maxsize=8)
def _row_hashes(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The seed-independent half of a tape's row keys (each row index hashed under each salt),
    made once per row count: a burst of streams makes its tapes in half the host time."""
    index = np.arange(rows, dtype=np.int64)
    hashes = tuple(mix32(index ^ salt) for salt in _ROW_SALTS)
    for h in hashes:
        h.flags.writeable = False
    return hashes


@dataclass(frozen=True)
class FlowWindow:
    """What one job's pass gives the flow: its tokens ``[first_token, end)`` after the prompt.

    Without a left-context cap (and for non-streaming jobs) ``first_token`` is 0. With one, the
    tokens before ``first_token`` are left out: the flow's new frame ``i`` of this pass is the
    job's new frame ``i + frame_offset`` (the stream's timeline, the frames from the prompt-mel
    length ``Tm`` on of a flow over all tokens). That holds for an odd prompt mel too: dropping
    ``first_token`` tokens removes ``2 first_token`` frames after the prompt region, wherever its
    end ``Tm`` falls. The noise of token frames is read from the job's noise tape at their
    absolute columns (``2 (Tp + t)`` for token ``t``, ``Tp`` the voice's whole prompt), so it does
    not change between windows.
    """

    tokens: list[int]
    """The flow's new tokens: the job's tokens ``first_token .. end`` (a final pass's silence
    tokens included)."""
    first_token: int
    """Index of ``tokens[0]`` among the job's tokens."""
    final: bool
    """The job's last pass."""

    @property
    def end(self) -> int:
        """Tokens of the job this pass has read (its absolute end)."""
        return self.first_token + len(self.tokens)

    @property
    def frame_offset(self) -> int:
        """The job's new frame of this pass's mel frame 0 (2 mel frames per token)."""
        return 2 * self.first_token


@dataclass
class StreamState:
    """What a streaming job has vocoded and sent (see the module docstring)."""

    flow_noise: NoiseTape
    source_noise: NoiseTape
    phases: np.ndarray  # [harmonics] initial harmonic phases (float64)
    next_threshold: int  # usable tokens at which the next window ends (its pass reads holdback more)
    next_window: int  # size of that window
    mel_end: int = 0  # mel frames vocoded so far
    hift_start: int = 0  # first mel frame the next pass's HiFT reads
    cycles: float = 0.0  # fundamental cycles (f0 integrated) over frames [0, hift_start)
    sent: int = 0  # samples sent
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # held audio after `sent`
    passes: int = 0
    first_sent_at: float | None = None  # stage clock when its first audio left


@dataclass
class Job:
    """A job's tokens and state. ``tokens`` are the usable tokens so far (the variant's rules
    applied incrementally, silence tokens not included)."""

    job_id: str
    voice: S3GenPrompt  # the S3Gen part of the job's voice
    seed: int
    n_steps: int | None
    cfg_rate: float | None
    rules: TokenRules
    order: int
    priority: int = 1  # lower goes first (the engine's Priority: 0 high, 1 normal, 2 low)
    added_at: float = 0.0  # stage clock at add()
    final_at: float | None = None  # stage clock when T3 was done
    stream: StreamState | None = None
    tokens: list[int] = field(default_factory=list)
    final: bool = False
    saw_bos: bool = False
    saw_eos: bool = False
    dropped_invalid: int = 0

    @property
    def streaming(self) -> bool:
        return self.stream is not None

    def accept(self, raw: list[int]) -> None:
        """Apply the variant's clean-up to newly arrived raw tokens, as postprocess_speech_tokens
        does to the whole list: the span after the first BOS up to the first EOS (original,
        multilingual), then only real speech codes."""
        rules = self.rules
        for t in raw:
            if rules.cut_at_markers:
                if t == rules.bos and not self.saw_bos:
                    self.saw_bos = True
                    if self.stream is not None and self.stream.passes:
                        logger.warning("job %s: a start-of-speech token after audio was sent; "
                                       "the tokens before it stay in the audio", self.job_id)
                    else:
                        self.tokens.clear()
                    continue
                if self.saw_eos:
                    continue
                if t == rules.eos:
                    self.saw_eos = True
                    continue
            if 0 <= t < rules.num_codes:
                self.tokens.append(t)
            else:
                self.dropped_invalid += 1
                if not rules.filter_invalid and self.dropped_invalid == 1:
                    logger.warning("job %s: dropped speech token(s) outside 0..%d that S3Gen cannot vocode",
                                   self.job_id, rules.num_codes - 1)

    def next_pass(self, holdback: int) -> tuple[list[int], bool]:
        """(tokens, final) of the job's next pass. A stream's window ``k`` ends at a fixed token
        count ``e_k`` and its pass reads exactly ``e_k + holdback`` tokens, so the audio depends
        only on the tokens and the seed, never on how they were pushed or when ``step`` ran. The
        final pass reads everything, plus the variant's silence tokens."""
        stream = self.stream
        if stream is not None and len(self.tokens) > stream.next_threshold + holdback:
            return self.tokens[:stream.next_threshold + holdback], False
        assert self.final
        return self.tokens + [SILENCE_TOKEN] * self.rules.silence_tokens, True

    def flow_window(self, holdback: int, context_tokens: int | None, prompt_shift: int) -> FlowWindow:
        """The flow input of the job's next pass (:meth:`next_pass`'s tokens), left-capped.

        ``context_tokens`` (L, None: no cap) bounds the tokens a stream's pass re-reads before
        the first token whose frames its HiFT reads (``hift_start``): the flow gets the tokens
        from ``max(0, h - L)`` on, where ``h`` is the token of frame ``hift_start``. Token ``t``
        owns new frames ``2 t - prompt_shift`` and ``2 t + 1 - prompt_shift``, where
        ``prompt_shift = Tm - 2 Tp`` (the prompt mel's frames beyond two per prompt token: 0, or
        +-1 for an odd prompt mel). The first token is also kept at or before frame
        ``hift_start`` itself (``2 first_token <= hift_start``), so every frame HiFT reads is in
        the pass's mel."""
        tokens, final = self.next_pass(holdback)
        stream = self.stream
        if stream is None or context_tokens is None or stream.hift_start == 0:
            return FlowWindow(tokens, 0, final)
        first_read = (stream.hift_start + prompt_shift) // 2
        first = max(0, min(first_read - context_tokens, stream.hift_start // 2))
        return FlowWindow(tokens[first:], first, final)

    def runs_out_at(self, lead: float | None) -> float | None:
        """When its listener runs out of the audio it has sent so far, on the stage clock: that
        audio plays from when its first sample left or, if later, when the audio ahead of it
        runs out (``lead``; None: nothing ahead). None before its first audio."""
        stream = self.stream
        if stream is None or stream.first_sent_at is None:
            return None
        start = stream.first_sent_at if lead is None else max(stream.first_sent_at, lead)
        return start + stream.sent / SAMPLE_RATE

    def deadline(self, margin_s: float, lead: float | None = None) -> float:
        """When this job's next pass is due, on the stage clock (earliest deadline first): a
        stream that has sent nothing is due since it was added (time to first audio), or, when
        its listener still has earlier audio to hear (``lead``: when that runs out, see
        :class:`~chorus.vocoder.listeners.Listeners`), ``margin_s`` before that; one that has
        audio out is due ``margin_s`` before its listener would run out of it; a non-streaming
        job is due since its tokens were complete."""
        if self.stream is None:
            return self.final_at if self.final_at is not None else self.added_at
        runs_out = self.runs_out_at(lead)
        if runs_out is not None:
            return runs_out - margin_s
        return self.added_at if lead is None else max(self.added_at, lead - margin_s)

    def is_ready(self, holdback: int) -> bool:
        if self.final:
            return True
        return self.stream is not None and len(self.tokens) > self.stream.next_threshold + holdback

    def sample_limit(self, num_tokens: int) -> int | None:
        """Multilingual: the audio of ``num_tokens`` tokens ends before the last token's
        (``max(1, N - 1) * 960``). None when the variant keeps all the audio."""
        if not self.rules.drop_last_token_audio:
            return None
        return max(1, num_tokens - 1) * SAMPLES_PER_TOKEN


def new_stream(seed: int, device: torch.device, flow_dtype: torch.dtype, harmonics: int,
               first_window: int) -> StreamState:
    """A stream's randomness, all from ``seed``: the flow noise tape (80 mel bins, by frame), the
    HiFT source-noise tape (per harmonic, by sample) and the initial harmonic phases."""
    seeds = torch.randint(0, 2 ** 62, (2,), generator=torch.Generator().manual_seed(seed)).tolist()
    phase_gen = torch.Generator().manual_seed(seed)
    phases = (torch.rand(harmonics, generator=phase_gen, dtype=torch.float64) * 2 - 1) * math.pi
    phases[0] = 0.0
    return StreamState(
        flow_noise=NoiseTape(80, seeds[0], device, flow_dtype),
        source_noise=NoiseTape(harmonics, seeds[1], device),
        phases=phases.numpy(), next_threshold=first_window, next_window=first_window,
    )


@functools.lru_cache(maxsize=64)
def raised_cosine(length: int) -> tuple[np.ndarray, np.ndarray]:
    """(fade-in gains 0 -> 1 over ``length`` samples, the fade-out ``1 - gains``), float32,
    read-only: computed once per length (a stream's cross-fades are all of a few lengths), so a
    pass's cross-fades are host arithmetic alone."""
    i = torch.arange(length, dtype=torch.float64)
    gains = ((1 - torch.cos(math.pi * (i + 0.5) / length)) / 2).float().numpy()
    fade_out = 1 - gains
    gains.flags.writeable = fade_out.flags.writeable = False
    return gains, fade_out
