"""Streaming encoders for the server's response formats, and speed through FFmpeg's atempo."""
from __future__ import annotations

import io
import math
import struct

import numpy as np
import pytest

from chorus.audio.pcm import to_pcm16
from chorus.audio.streaming import FORMATS, MEDIA_TYPES, StreamEncoder, encode_with_pyav
from chorus.audio.tempo import atempo_factors

av = pytest.importorskip("av")

SR = 24_000
CODECS = ("mp3", "opus", "aac", "flac")
# What a decoder gives beyond the input (samples at 24 kHz), measured (docs/audio-formats.md):
# mp3 and aac start with the encoder's priming and end padded to whole frames, and their
# streams cannot say so; Ogg Opus and FLAC carry exact lengths.
PRIMING = {"mp3": 1105, "aac": 1024}
EXTRA = {"mp3": (1105, 1105 + 2 * 576), "aac": (1024, 1024 + 1024), "opus": (0, 0), "flac": (0, 0),
         "wav": (0, 0), "pcm": (0, 0)}


def _tone(samples: int, freq: float = 440.0, start: int = 0) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * freq * np.arange(start, start + samples) / SR)).astype(np.float32)


def _decode(data: bytes, fmt: str) -> np.ndarray:
    """Mono float samples at 24 kHz (Opus decodes at 48 kHz: every other sample is kept)."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0
    # a short ADTS stream is not always recognised by probing: name the demuxer
    with av.open(io.BytesIO(data), format="aac" if fmt == "aac" else None) as container:
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
    samples = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    assert rate in (SR, 2 * SR)
    return samples[::2] if rate == 2 * SR else samples


def _encode(fmt: str, pieces, **kwargs) -> bytes:
    encoder = StreamEncoder(fmt, SR, **kwargs)
    return b"".join(encoder.write(piece) for piece in pieces) + encoder.close()


def _peak_hz(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / SR)[spectrum.argmax()])


def test_every_format_has_a_media_type():
    assert FORMATS == ("mp3", "opus", "aac", "flac", "wav", "pcm")
    assert MEDIA_TYPES == {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                           "wav": "audio/wav", "pcm": "audio/pcm"}
    assert [StreamEncoder(fmt).media_type for fmt in FORMATS] == [MEDIA_TYPES[fmt] for fmt in FORMATS]


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_keeps_duration_and_pitch(fmt):
    samples = _tone(SR + 137)
    decoded = _decode(_encode(fmt, [samples]), fmt)
    low, high = EXTRA[fmt]
    assert low <= decoded.size - samples.size <= high
    start = PRIMING.get(fmt, 0)
    assert _peak_hz(decoded[start:start + samples.size]) == pytest.approx(440, abs=3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_many_small_pieces_decode_like_one_piece(fmt):
    samples = _tone(SR + 137)
    cuts = np.sort(np.random.default_rng(0).integers(0, samples.size, 300))
    pieces = np.split(samples, cuts)  # sizes 0 to a few hundred samples, some empty
    assert any(piece.size == 0 for piece in pieces)
    one = _decode(_encode(fmt, [samples]), fmt)
    many = _decode(_encode(fmt, pieces), fmt)
    np.testing.assert_array_equal(many, one)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_leave_before_close(fmt):
    """2 s written as 100 ms pieces: all but the last ~0.1 s is out before close (0 s for wav/pcm)."""
    encoder = StreamEncoder(fmt, SR)
    sent = b""
    for index in range(20):
        sent += encoder.write(_tone(2400, start=index * 2400))
    covered = _decode(sent, fmt).size - PRIMING.get(fmt, 0)
    held = 20 * 2400 - covered
    assert held == 0 if fmt in ("wav", "pcm") else 0 < held <= 0.15 * SR
    encoder.close()


def test_opus_first_bytes_are_the_ogg_headers_and_audio_trails_by_about_a_page():
    encoder = StreamEncoder("opus", SR)
    first = encoder.write(_tone(1200))  # 50 ms: within the first 100 ms page
    assert first.count(b"OggS") == 2 and b"OpusHead" in first and b"OpusTags" in first
    second = encoder.write(_tone(SR, start=1200))  # one more second: ~0.9 s of it is paged out
    assert 0.85 * SR <= _decode(first + second, "opus").size <= SR
    encoder.close()


def test_wav_header_is_open_ended_24k_mono_16_bit():
    samples = _tone(1000)
    data = _encode("wav", [samples])
    riff, riff_size, wave, fmt_id, fmt_size = struct.unpack("<4sI4s4sI", data[:20])
    codec, channels, rate, byte_rate, block_align, bits = struct.unpack("<HHIIHH", data[20:36])
    data_id, data_size = struct.unpack("<4sI", data[36:44])
    assert (riff, riff_size, wave, fmt_id, fmt_size) == (b"RIFF", 0xFFFFFFFF, b"WAVE", b"fmt ", 16)
    assert (codec, channels, rate, byte_rate, block_align, bits) == (1, 1, SR, 2 * SR, 2, 16)
    assert (data_id, data_size) == (b"data", 0xFFFFFFFF)
    assert data[44:] == to_pcm16(samples).astype("<i2").tobytes()


def test_pcm_is_exactly_the_pcm16_of_the_pieces():
    pieces = [_tone(100), np.zeros(0, np.float32), np.array([1.5, -1.5, 0.25], np.float32), _tone(7)]
    data = _encode("pcm", pieces)
    assert data == to_pcm16(np.concatenate(pieces)).astype("<i2").tobytes()


def test_flac_holds_the_same_16_bit_samples_as_pcm():
    samples = np.concatenate([_tone(3000), np.array([1.5, -1.5, 0.25], np.float32)])
    with av.open(io.BytesIO(_encode("flac", [samples]))) as container:
        decoded = np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])
    np.testing.assert_array_equal(decoded, to_pcm16(samples))


@pytest.mark.parametrize("fmt,length", [("wav", 0), ("flac", 0), ("pcm", 0), ("opus", 1), ("mp3", 1728),
                                        ("aac", 2048)])
def test_an_empty_stream_still_decodes(fmt, length):
    encoder = StreamEncoder(fmt, SR)
    data = encoder.write(np.zeros(0, np.float32)) + encoder.close()
    decoded = _decode(data, fmt)
    assert decoded.size == length and np.abs(decoded).max(initial=0) < 1e-3
    assert (len(data) == 44) if fmt == "wav" else (data == b"") if fmt == "pcm" else data


def test_whole_mp3_files_are_gapless():
    """encode_with_pyav writes into a seekable buffer: the LAME header lets the decoder trim."""
    samples = _tone(SR + 137)
    assert _decode(encode_with_pyav(samples, SR, "mp3"), "mp3").size == samples.size


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_changes_duration(speed):
    samples = _tone(2 * SR)
    out = _decode(_encode("pcm", np.array_split(samples, 13), speed=speed), "pcm")
    # atempo's measured error is below 60 ms of output at every speed (docs/audio-formats.md)
    assert abs(out.size - samples.size / speed) <= 0.08 * SR


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_a_pause_keeps_its_exact_length_at_any_speed(speed):
    before, after, pause = _tone(SR), _tone(SR, start=SR), np.zeros(SR // 2, np.float32)
    encoder = StreamEncoder("pcm", SR, speed=speed)
    data = encoder.write(before) + encoder.write(pause, pause=True) + encoder.write(after) + encoder.close()
    alone = [StreamEncoder("pcm", SR, speed=speed) for _ in range(2)]  # each side at that speed on its own
    sides = [_decode(e.write(side) + e.close(), "pcm") for e, side in zip(alone, (before, after))]
    np.testing.assert_array_equal(_decode(data, "pcm"), np.concatenate([sides[0], pause, sides[1]]))


def test_speed_keeps_the_pitch():
    out = _decode(_encode("pcm", np.array_split(_tone(2 * SR), 7), speed=1.5), "pcm")
    assert out.size == pytest.approx(2 * SR / 1.5, abs=0.08 * SR)
    assert _peak_hz(out) == pytest.approx(440, abs=3)


def test_speed_goes_through_the_codecs_too():
    out = _decode(_encode("opus", np.array_split(_tone(2 * SR), 5), speed=2.0), "opus")
    assert abs(out.size - SR) <= 0.08 * SR


def test_atempo_is_chained_within_half_to_double():
    assert atempo_factors(1.5) == [1.5]
    assert atempo_factors(0.25) == [0.5, 0.5] and atempo_factors(4.0) == [2.0, 2.0]
    for speed in (0.3, 3.0, 0.26, 3.9):
        factors = atempo_factors(speed)
        assert len(factors) == 2 and all(0.5 <= f <= 2.0 for f in factors)
        assert math.prod(factors) == pytest.approx(speed)


def test_unknown_format_lists_the_choices():
    with pytest.raises(ValueError, match="mp3, opus, aac, flac, wav, pcm"):
        StreamEncoder("ogg")


@pytest.mark.parametrize("speed", [0.2, 4.5, float("nan"), "fast", True])
def test_speed_outside_quarter_to_four_is_refused(speed):
    with pytest.raises(ValueError, match="speed"):
        StreamEncoder("wav", SR, speed=speed)


def test_sample_rate_the_codec_cannot_take_is_refused():
    with pytest.raises(ValueError, match="mp3.*23000 Hz"):
        StreamEncoder("mp3", 23000)


def test_non_mono_samples_are_refused():
    with pytest.raises(ValueError, match="mono"):
        StreamEncoder("mp3").write(np.zeros((2, 100), np.float32))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_samples_are_refused_and_the_stream_goes_on(bad):
    encoder = StreamEncoder("pcm")
    with pytest.raises(ValueError, match="NaN or infinite"):
        encoder.write(np.array([0.0, bad], np.float32))
    assert encoder.write(np.array([0.5], np.float32)) + encoder.close() == to_pcm16(np.array([0.5])).tobytes()


def test_integer_samples_are_refused():
    with pytest.raises(ValueError, match="float"):
        StreamEncoder("wav").write(np.zeros(10, np.int16))


def test_a_closed_encoder_refuses_writes_and_closes_again_quietly():
    encoder = StreamEncoder("aac")
    encoder.write(_tone(100))
    assert encoder.close()
    assert encoder.close() == b""
    with pytest.raises(ValueError, match="closed"):
        encoder.write(_tone(100))


def test_abort_drops_the_stream_without_flushing():
    encoder = StreamEncoder("mp3", speed=2.0)
    encoder.write(_tone(SR))
    encoder.abort()
    assert encoder.closed and encoder.close() == b""


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_whole_file_is_sent_at_close_with_complete_headers(fmt):
    import wave

    import soundfile

    pieces = [_tone(2400, start=i * 2400) for i in range(5)]
    encoder = StreamEncoder(fmt, SR, streaming=False)
    assert [encoder.write(piece) for piece in pieces] == [b""] * 5
    data = encoder.close()
    assert 12000 <= _decode(data, fmt).size <= 12000 + EXTRA[fmt][1]  # mp3's LAME header lets decoders trim
    if fmt in ("wav", "pcm"):  # the same samples as a stream, only the header differs
        assert data[-24000:] == _encode(fmt, pieces)[-24000:]
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as wav:
            assert wav.getnframes() == 12000
    if fmt == "flac":
        assert soundfile.info(io.BytesIO(data)).frames == 12000


@pytest.mark.parametrize("fmt, rate", [("pcm_24000", 24_000), ("pcm_16000", 16_000), ("pcm_8000", 8_000)])
def test_raw_pcm_at_a_rate_is_resampled_as_one_stream(fmt, rate):
    samples = _tone(SR + 137)
    cuts = np.sort(np.random.default_rng(1).integers(0, samples.size, 50))
    encoder = StreamEncoder(fmt, SR)
    data = b"".join(encoder.write(piece) for piece in np.split(samples, cuts)) + encoder.close()
    assert encoder.output_rate == rate
    assert len(data) == 2 * round(samples.size * rate / SR)  # however the pieces were cut
    decoded = np.frombuffer(data, "<i2").astype(np.float32) / 32767.0
    spectrum = np.abs(np.fft.rfft(decoded * np.hanning(decoded.size)))
    assert float(np.fft.rfftfreq(decoded.size, 1 / rate)[spectrum.argmax()]) == pytest.approx(440, abs=3)


def test_mulaw_decodes_with_ffmpeg_to_the_pcm_within_one_step():
    samples = _tone(SR)
    encoder = StreamEncoder("mulaw_8000", SR)
    data = encoder.write(samples[:1000]) + encoder.write(samples[1000:]) + encoder.close()
    assert len(data) == SR // 3  # one byte per 8 kHz sample
    reference = StreamEncoder("pcm_8000", SR)
    pcm = np.frombuffer(reference.write(samples) + reference.close(), "<i2").astype(np.float64)
    with av.open(io.BytesIO(data), format="mulaw", options={"sample_rate": "8000", "ch_layout": "mono"}) as c:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)]).astype(np.float64)
    assert decoded.size == pcm.size
    # mu-law has 16 steps per doubling of the magnitude: an error of at most one step (1/16 of it)
    assert np.all(np.abs(decoded - pcm) <= np.maximum(np.abs(pcm), 64) / 16 + 1)
    assert StreamEncoder("mulaw_8000").media_type == "audio/basic"
