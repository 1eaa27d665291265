"""Streaming encoders for the HTTP server's response formats (OpenAI's ``response_format``).

Mono float32 pieces of any length (empty included) go in through ``StreamEncoder.write`` as the
vocoder produces them; each call returns the bytes that are ready to send, and ``close`` returns the
rest. ``wav`` and ``pcm`` are written here (a 44-byte header with open-ended sizes, then 16-bit
PCM), and so are the telephony formats ``pcm_24000``/``pcm_16000``/``pcm_8000`` (16-bit PCM at that
rate, resampled by soxr as the pieces come) and ``mulaw_8000`` (G.711 mu-law at 8 kHz); ``mp3``, ``opus``, ``aac`` and ``flac`` go through a PyAV (FFmpeg) encoder and muxer that
writes into a write-only buffer drained after every call. The buffer has no ``seek`` on purpose:
muxers then stream instead of going back to patch headers in bytes that have already been sent.

``speed`` other than 1.0 runs the samples through FFmpeg's ``atempo`` first (chorus.audio.tempo).
``FORMATS`` and ``MEDIA_TYPES`` are the tables the server reads. Codec settings, the measured
priming/padding and the empty-stream behaviour are in docs/audio-formats.md.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from chorus.audio.pcm import to_mulaw, to_pcm16
from chorus.audio.resample import StreamResampler
from chorus.audio.tempo import MAX_SPEED, MIN_SPEED, TempoStream, check_speed

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Opus in an Ogg container
    "aac": "audio/aac",  # ADTS
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",  # raw 16-bit little-endian mono at the input rate (24 kHz for Chatterbox)
}
# Telephony formats (the voice-agent WebSocket's): raw mono at a fixed rate, the input resampled
# to it: 16-bit little-endian PCM, or G.711 mu-law.
RAW_RATES = {"pcm_24000": 24_000, "pcm_16000": 16_000, "pcm_8000": 8_000, "mulaw_8000": 8_000}
RAW_MEDIA_TYPES = {"pcm_24000": "audio/pcm;rate=24000", "pcm_16000": "audio/pcm;rate=16000",
                   "pcm_8000": "audio/pcm;rate=8000", "mulaw_8000": "audio/basic"}  # RFC 2046: 8 kHz mu-law
DEFAULT_SAMPLE_RATE = 24_000

__all__ = ["FORMATS", "MEDIA_TYPES", "RAW_RATES", "RAW_MEDIA_TYPES", "BIT_RATES", "MIN_SPEED", "MAX_SPEED", "StreamEncoder", "check_format",
           "media_type", "wav_stream_header", "encode_with_pyav"]


@dataclass(frozen=True)
class _Codec:
    container: str  # FFmpeg muxer
    codec: str  # FFmpeg encoder
    sample_format: str  # what the encoder is fed
    bit_rate: int | None = None
    # Input rates the encoder takes as they are; others are resampled by PyAV to ``fallback_rate``.
    # None: every rate goes in as it is (the encoder refuses the ones it cannot do).
    rates: tuple[int, ...] | None = None
    fallback_rate: int | None = None
    muxer_options: dict = field(default_factory=dict)
    # mp3/aac have no header and Ogg Opus with no audio page does not open in FFmpeg, so an empty
    # stream is given one silent sample to stay decodable (docs/audio-formats.md).
    empty_gets_a_sample: bool = True


_CODECS = {
    # id3v2_version=0: no ID3 tag, the stream is bare MPEG frames. The Xing/LAME header (gapless
    # trimming) needs a seekable target, so only whole files (encode_with_pyav) get it.
    "mp3": _Codec("mp3", "libmp3lame", "fltp", bit_rate=128_000, muxer_options={"id3v2_version": "0"}),
    # libopus takes 24 kHz as it is (decoders still play Opus at 48 kHz); resampling to 48 kHz
    # first measured no better (SNR on speech 21.2 dB vs 22.6 dB) and loses streams of a few samples in the resampler's delay.
    # FFmpeg's default Ogg page is 1 s and the muxer holds one finished page back, so nothing
    # would leave for 2 s; 100 ms pages cost ~30 bytes each and hold back about 0.11 s (measured).
    "opus": _Codec("ogg", "libopus", "flt", bit_rate=64_000, rates=(8000, 12000, 16000, 24000, 48000),
                   fallback_rate=48_000, muxer_options={"page_duration": "100000"}),
    "aac": _Codec("adts", "aac", "fltp", bit_rate=64_000),
    # FLAC gets to_pcm16's samples, so its decoded samples equal the WAV's; no 8 KiB padding block.
    "flac": _Codec("flac", "flac", "s16", muxer_options={"metadata_header_padding": "0"},
                   empty_gets_a_sample=False),
}
BIT_RATES = {fmt: codec.bit_rate for fmt, codec in _CODECS.items() if codec.bit_rate}


def check_format(fmt: str) -> str:
    """``fmt`` if it is one of ``FORMATS`` or ``RAW_RATES``, else a ``ValueError`` listing them."""
    if fmt not in FORMATS and fmt not in RAW_RATES:
        raise ValueError(f"unsupported response format {fmt!r}; choose one of {', '.join((*FORMATS, *RAW_RATES))}")
    return fmt


def media_type(fmt: str) -> str:
    """The HTTP Content-Type of ``fmt``."""
    return {**MEDIA_TYPES, **RAW_MEDIA_TYPES}[check_format(fmt)]


def _check_sample_rate(sample_rate: int) -> int:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    return int(sample_rate)


def _check_samples(samples) -> np.ndarray:
    array = np.asarray(samples)
    if array.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"expected float samples in [-1, 1], got dtype {array.dtype}")
    array = array.astype(np.float32, copy=False)
    if array.size and not np.isfinite(array).all():
        raise ValueError("the audio contains NaN or infinite samples")
    return np.clip(array, -1.0, 1.0)


def wav_stream_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 44-byte PCM16 mono RIFF/WAVE header. Without ``data_bytes`` its RIFF and data sizes are
    0xFFFFFFFF ("unknown"), as streaming servers send when the length is not known up front;
    with it, the sizes of a complete file of that many bytes of samples."""
    block_align = 2  # one channel of 16-bit samples
    riff, data = (0xFFFFFFFF, 0xFFFFFFFF) if data_bytes is None else (36 + data_bytes, data_bytes)
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * block_align, block_align, 16)
            + b"data" + struct.pack("<I", data))


class _Drain:
    """A write-only file object: no ``seek``/``tell``, so PyAV marks the output non-seekable."""

    def __init__(self):
        self._chunks: list[bytes] = []

    def write(self, data) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


class _PyAVEncoder:
    """One PyAV output container with one mono audio stream, writing into ``target``."""

    def __init__(self, fmt: str, sample_rate: int, target):
        import av

        self._av = av
        self._codec = _CODECS[fmt]
        self._rate = sample_rate
        self._time_base = Fraction(1, sample_rate)
        self._pts = 0
        self._container = av.open(target, mode="w", format=self._codec.container,
                                  options=dict(self._codec.muxer_options))
        try:
            rates = self._codec.rates
            rate = sample_rate if rates is None or sample_rate in rates else self._codec.fallback_rate
            stream = self._container.add_stream(self._codec.codec, rate=rate)
            stream.layout = "mono"
            stream.format = self._codec.sample_format
            if self._codec.bit_rate:
                stream.bit_rate = self._codec.bit_rate
            self._stream = stream
            self._container.start_encoding()  # opens the encoder and writes the container header
        except (av.FFmpegError, ValueError) as exc:
            self._container.close()
            raise ValueError(f"cannot encode {fmt} from mono audio at {sample_rate} Hz: {exc}") from exc

    def encode(self, samples: np.ndarray) -> None:
        """Encode checked float32 samples in [-1, 1]."""
        if not samples.size:
            return
        data = to_pcm16(samples) if self._codec.sample_format == "s16" else samples
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(data)[None, :],
                                                 format=self._codec.sample_format, layout="mono")
        frame.sample_rate = self._rate
        frame.time_base = self._time_base
        frame.pts = self._pts
        self._pts += samples.size
        self._container.mux(self._stream.encode(frame))

    def finish(self) -> None:
        """Flush the encoder (and PyAV's resampler) and write the trailer."""
        if self._pts == 0 and self._codec.empty_gets_a_sample:
            self.encode(np.zeros(1, np.float32))
        self._container.mux(self._stream.encode(None))
        self._container.close()

    def abort(self) -> None:
        self._container.close()


class StreamEncoder:
    """Encodes a stream of mono float32 pieces as ``fmt`` (one of ``FORMATS``, or a telephony
    format of ``RAW_RATES``, whose bytes are at ``output_rate``), piece by piece.

    ``write(samples)`` returns the bytes ready so far (possibly ``b""``); ``close()`` flushes and
    returns the rest. Samples are clipped to [-1, 1]; ``speed`` in [0.25, 4.0] changes the tempo
    with the pitch kept. An encoder that is closed without any samples still returns a decodable
    stream: wav and flac a header with no samples, pcm no bytes, and mp3, opus and aac one silent
    sample (they have no header that could stand alone), which decodes to 1 sample (opus) or a few
    frames of silence with the codec's priming (mp3: 1728 samples, aac: 2048).
    With ``streaming=False`` nothing leaves before ``close``, which returns the whole file with
    complete headers (a WAV's sizes, a FLAC's length and MD5, mp3's Xing/LAME header): for
    responses whose audio is all known before the first byte is sent.
    Not thread-safe: one encoder per response.
    """

    def __init__(self, fmt: str, sample_rate: int = DEFAULT_SAMPLE_RATE, *, speed: float = 1.0,
                 streaming: bool = True):
        self.format = check_format(fmt)
        self.sample_rate = _check_sample_rate(sample_rate)
        self.speed = check_speed(speed)
        self.media_type = media_type(fmt)
        self.streaming = streaming
        self.closed = False
        self._tempo = TempoStream(self.speed, self.sample_rate) if self.speed != 1.0 else None
        self._drain: _Drain | None = None
        self._codec: _PyAVEncoder | None = None
        self._whole: list[np.ndarray] | None = None if streaming else []
        self._pending = wav_stream_header(self.sample_rate) if fmt == "wav" and streaming else b""
        self.output_rate = RAW_RATES.get(fmt, self.sample_rate)  # the rate of the bytes (raw formats)
        self._resampler = StreamResampler(self.sample_rate, self.output_rate) \
            if self.output_rate != self.sample_rate else None
        if fmt in _CODECS and streaming:
            self._drain = _Drain()
            self._codec = _PyAVEncoder(fmt, self.sample_rate, self._drain)

    def write(self, samples: np.ndarray, *, pause: bool = False) -> bytes:
        """Encode one piece (1-D float samples at ``sample_rate``); returns the bytes ready to send.
        ``pause``: the piece is a pause's silence, kept as it is whatever the speed (the tempo
        filter is flushed before it and started afresh after it), so a pause lasts exactly its
        length at every speed (docs/pauses.md)."""
        if self.closed:
            raise ValueError("write to a closed StreamEncoder")
        samples = _check_samples(samples)
        if self._tempo is not None:
            if pause:
                samples = np.concatenate([self._tempo.flush(), samples])
                self._tempo = TempoStream(self.speed, self.sample_rate)
            else:
                samples = self._tempo.process(samples)
        return self._emit(samples)

    def close(self) -> bytes:
        """Flush everything and return the last bytes; closing again returns ``b""``."""
        if self.closed:
            return b""
        tail = self._emit(self._tempo.flush() if self._tempo is not None else np.zeros(0, np.float32), last=True)
        self.closed = True
        if self._whole is not None:
            return self._encode_whole(np.concatenate(self._whole) if self._whole else np.zeros(0, np.float32))
        if self._codec is not None:
            self._codec.finish()
            tail += self._drain.take()
        return tail

    def abort(self) -> None:
        """Stop without flushing (the client went away): frees the encoder, returns nothing."""
        if self.closed:
            return
        self.closed = True
        self._whole = None
        if self._codec is not None:
            self._codec.abort()
            self._drain.take()

    def _encode_whole(self, samples: np.ndarray) -> bytes:
        self._whole = None
        if self.format in _CODECS:
            return encode_with_pyav(samples, self.sample_rate, self.format)
        if self.format in RAW_RATES:
            return self._raw(samples, last=True)
        data = to_pcm16(samples).astype("<i2", copy=False).tobytes()
        return wav_stream_header(self.sample_rate, len(data)) + data if self.format == "wav" else data

    def _emit(self, samples: np.ndarray, last: bool = False) -> bytes:
        if self._whole is not None:
            if samples.size:
                self._whole.append(samples)
            return b""
        out, self._pending = self._pending, b""
        if self._codec is not None:
            self._codec.encode(samples)
            return out + self._drain.take()
        return out + self._raw(samples, last)

    def _raw(self, samples: np.ndarray, last: bool) -> bytes:
        """16-bit PCM or mu-law bytes of ``samples`` at ``output_rate`` (``last``: flush the resampler)."""
        if self._resampler is not None:
            samples = self._resampler.process(samples) if samples.size else np.zeros(0, np.float32)
            if last:
                samples = np.concatenate([samples, self._resampler.flush()])
        if not samples.size:
            return b""
        if self.format == "mulaw_8000":
            return to_mulaw(samples).tobytes()
        return to_pcm16(samples).astype("<i2", copy=False).tobytes()


def encode_with_pyav(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole clip as one ``mp3``/``opus``/``aac``/``flac`` file, with the streaming encoders'
    settings but a seekable buffer, so the muxer can go back and fill in its headers (mp3's
    Xing/LAME header with the encoder delay, which gapless decoders trim; FLAC's total length)."""
    if check_format(fmt) not in _CODECS:
        raise ValueError(f"encode_with_pyav writes {', '.join(_CODECS)}, not {fmt!r}")
    samples = _check_samples(samples)
    buffer = io.BytesIO()
    encoder = _PyAVEncoder(fmt, _check_sample_rate(sample_rate), buffer)
    encoder.encode(samples)
    encoder.finish()
    return buffer.getvalue()
