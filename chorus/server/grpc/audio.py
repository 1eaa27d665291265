"""The audio of a Riva response: the service's 16-bit PCM at the model's rate, resampled to the
request's ``sample_rate_hz`` and encoded as its ``encoding``: LINEAR_PCM (16-bit little-endian,
no header), MULAW and ALAW (G.711, 8 bits a sample) inline; FLAC and OGGOPUS through the
server's streaming encoders (on a worker thread). docs/grpc.md, "Audio"."""
from __future__ import annotations

import asyncio

import numpy as np

from chorus.models.s3gen.s3gen import SAMPLE_RATE
from chorus.server.grpc.errors import invalid
from chorus.server.grpc.messages import ENCODINGS
from chorus.server.grpc.requests import ALAW, FLAC, LINEAR_PCM, MULAW, OGGOPUS

MIN_RATE, MAX_RATE = 8_000, 48_000
_CODEC_FORMATS = {FLAC: "flac", OGGOPUS: "opus"}


class RivaAudio:
    """One response's encoder: ``await write(pcm)`` and ``await close()`` return the bytes ready;
    ``abort()`` frees it without flushing. ``whole``: a unary response (codecs write complete
    headers)."""

    def __init__(self, encoding: int, sample_rate_hz: int, *, whole: bool):
        from chorus.audio.resample import StreamResampler

        if encoding == 0:
            encoding = LINEAR_PCM
        if encoding not in (LINEAR_PCM, MULAW, ALAW, FLAC, OGGOPUS):
            raise invalid("encoding", f"{ENCODINGS.get(encoding, encoding)} is not an encoding this server "
                                      "writes; use LINEAR_PCM, MULAW, ALAW, FLAC or OGGOPUS")
        rate = sample_rate_hz or SAMPLE_RATE
        if not MIN_RATE <= rate <= MAX_RATE:
            raise invalid("sample_rate_hz", f"{rate} Hz is out of range; use {MIN_RATE}..{MAX_RATE} (or 0: "
                                            f"the model's {SAMPLE_RATE} Hz)")
        self.encoding, self.sample_rate = encoding, rate
        self._resampler = StreamResampler(SAMPLE_RATE, rate) if rate != SAMPLE_RATE else None
        self._codec = None
        if encoding in _CODEC_FORMATS:
            from chorus.audio.streaming import StreamEncoder

            self._codec = StreamEncoder(_CODEC_FORMATS[encoding], rate, streaming=not whole)

    async def write(self, pcm: bytes) -> bytes:
        if self.encoding == LINEAR_PCM and self._resampler is None:
            return pcm  # already what was asked: 16-bit PCM at the model's rate
        samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767.0
        if self._resampler is not None:
            samples = self._resampler.process(samples)
        return await self._encode(samples, last=False)

    async def close(self) -> bytes:
        tail = self._resampler.flush() if self._resampler is not None else np.zeros(0, np.float32)
        return await self._encode(tail, last=True)

    def abort(self) -> None:
        if self._codec is not None:
            self._codec.abort()

    async def _encode(self, samples: np.ndarray, *, last: bool) -> bytes:
        from chorus.audio.pcm import to_alaw, to_mulaw, to_pcm16

        if self._codec is not None:
            data = await asyncio.to_thread(self._codec.write, samples) if samples.size else b""
            return data + (await asyncio.to_thread(self._codec.close) if last else b"")
        if not samples.size:
            return b""
        if self.encoding == MULAW:
            return to_mulaw(samples).tobytes()
        if self.encoding == ALAW:
            return to_alaw(samples).tobytes()
        return to_pcm16(samples).astype("<i2", copy=False).tobytes()
