"""Decoding any common file to mono float32, and clear errors for data that is not audio."""
from __future__ import annotations

import io
import os
import random

import numpy as np
import pytest
import soundfile

from chorus.audio import AudioDecodeError, decode_audio, load_audio
from tests.conftest import DATA_DIR

CLIPS = ["sample-01.mp3", "sample-02.mp3", "sample-01-02.flac"]


def _stereo(sample_rate: int, seconds: float = 1.5) -> np.ndarray:
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    left = 0.3 * np.sin(2 * np.pi * 220 * t)
    right = 0.2 * np.sin(2 * np.pi * 330 * t + 0.5)
    return np.stack([left, right], axis=1).astype(np.float32)


@pytest.mark.parametrize("name", CLIPS)
def test_real_clips_load_like_librosa(name):
    librosa = pytest.importorskip("librosa")
    path = os.path.join(DATA_DIR, name)
    expected, _ = librosa.load(path, sr=24000)
    got = load_audio(path, 24000)
    assert got.sample_rate == 24000 and got.samples.dtype == np.float32
    np.testing.assert_array_equal(got.samples, expected)


@pytest.mark.parametrize("sample_rate,subtype", [(44100, "PCM_16"), (8000, "PCM_24"), (48000, "FLOAT"), (22050, "PCM_U8")])
def test_wav_of_any_rate_channels_and_subtype_loads_like_librosa(tmp_path, sample_rate, subtype):
    librosa = pytest.importorskip("librosa")
    path = tmp_path / "clip.wav"
    soundfile.write(path, _stereo(sample_rate), sample_rate, subtype=subtype)
    expected, _ = librosa.load(path, sr=24000)
    got = load_audio(path, 24000)
    np.testing.assert_array_equal(got.samples, expected)


def test_channels_are_averaged(tmp_path):
    data = _stereo(16000)
    path = tmp_path / "stereo.flac"
    soundfile.write(path, data, 16000, subtype="PCM_24")
    decoded = decode_audio(path)
    reread = soundfile.read(path, dtype="float32")[0]
    np.testing.assert_array_equal(decoded.samples, reread.mean(axis=1).astype(np.float32))
    assert decoded.sample_rate == 16000 and decoded.samples.ndim == 1


def test_bytes_and_file_objects_decode_like_paths():
    path = os.path.join(DATA_DIR, "sample-02.mp3")
    from_path = decode_audio(path).samples
    raw = open(path, "rb").read()
    np.testing.assert_array_equal(decode_audio(raw).samples, from_path)
    np.testing.assert_array_equal(decode_audio(io.BytesIO(raw)).samples, from_path)


def test_max_seconds_cuts_and_flags_the_clip():
    path = os.path.join(DATA_DIR, "sample-01-02.flac")
    full = decode_audio(path)
    cut = decode_audio(path, max_seconds=2.0)
    assert cut.truncated and not full.truncated
    np.testing.assert_array_equal(cut.samples, full.samples[: 2 * full.sample_rate])
    assert not decode_audio(path, max_seconds=60.0).truncated


@pytest.mark.parametrize("fmt,codec,ext", [("mp4", "aac", "m4a"), ("webm", "libopus", "webm")])
def test_formats_libsndfile_cannot_read_fall_back_to_pyav(tmp_path, fmt, codec, ext):
    av = pytest.importorskip("av")
    path = str(tmp_path / f"clip.{ext}")
    rate = 48000
    data = _stereo(rate, 1.0)
    with av.open(path, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "stereo"
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data.T), format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    with pytest.raises(soundfile.LibsndfileError):
        soundfile.info(path)
    decoded = decode_audio(path)
    assert decoded.sample_rate == rate and decoded.samples.dtype == np.float32
    assert abs(len(decoded.samples) - rate) < 0.1 * rate  # codec priming/padding only
    # a lossy copy of the channel mean: compare levels, not samples
    assert np.std(decoded.samples) == pytest.approx(np.std(data.mean(axis=1)), rel=0.1)


@pytest.mark.parametrize("data", [b"", b"RIFF\x24\x00\x00\x00WAVEfmt ", b"not audio at all" * 200,
                                  random.Random(0).randbytes(4096)],
                         ids=["empty", "truncated-header", "text", "random"])
def test_undecodable_data_raises_audio_decode_error(data):
    with pytest.raises(AudioDecodeError):
        decode_audio(data)


@pytest.mark.parametrize("data", [random.Random(1).randbytes(1 << 20), b"not audio at all" * 200],
                         ids=["random", "text"])
def test_undecodable_data_is_named_in_a_users_words_without_decoder_internals(data):
    with pytest.raises(AudioDecodeError) as raised:
        decode_audio(data)
    message = str(raised.value)
    assert message.startswith("not an audio file we can decode (tried: wav, flac, ogg, mp3, aiff, m4a/aac, webm, ...)")
    for internal in ("0x", "BytesIO", "Errno", "libsndfile", "FFmpeg", "<", ">"):
        assert internal not in message, message


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        decode_audio(tmp_path / "nope.wav")


def test_non_finite_samples_are_rejected(tmp_path):
    data = np.zeros(1000, dtype=np.float32)
    data[10] = np.nan
    path = tmp_path / "nan.wav"
    soundfile.write(path, data, 16000, subtype="FLOAT")
    with pytest.raises(AudioDecodeError, match="NaN"):
        decode_audio(path)


# ---- decompression bombs ------------------------------------------------------------------------

def _silent_flac(minutes: int, *, stated: bool, rate: int = 8000) -> bytes:
    """``minutes`` of silence as FLAC (about 1.4 KB a minute); ``stated=False`` blanks the
    STREAMINFO length, so only decoding can tell the duration."""
    import io

    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", samplerate=rate, channels=1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(minutes):
            f.write(np.zeros(rate * 60, dtype=np.float32))
    data = bytearray(buffer.getvalue())
    if not stated:
        head = int.from_bytes(data[18:26], "big")
        data[18:26] = (head & ~((1 << 36) - 1)).to_bytes(8, "big")
    return bytes(data)


def test_a_stated_length_over_the_limit_is_refused_before_decoding():
    from chorus.audio.errors import AudioTooLongError

    with pytest.raises(AudioTooLongError, match="header says it lasts 660 s"):
        decode_audio(_silent_flac(11, stated=True), max_seconds=60, refuse_seconds=600)


def test_a_hidden_length_is_refused_once_decoding_passes_the_limit():
    from chorus.audio.errors import AudioTooLongError

    with pytest.raises(AudioTooLongError, match="lasts more than 6[0-9] s"):
        decode_audio(_silent_flac(3, stated=False), max_seconds=30, refuse_seconds=60)


def test_under_the_refusal_limit_a_long_clip_is_still_cut_to_max_seconds():
    decoded = decode_audio(_silent_flac(2, stated=False), max_seconds=30, refuse_seconds=600)
    assert decoded.truncated and decoded.samples.shape[0] == 30 * 8000


def test_an_array_becomes_mono_decoded_audio_with_its_rate():
    from chorus.audio import DecodedAudio

    stereo = np.stack([np.ones(4), np.zeros(4)], axis=1)  # (samples, channels), as soundfile gives
    decoded = DecodedAudio.from_array(stereo, 16000, "a clip")
    assert decoded.sample_rate == 16000 and decoded.samples.dtype == np.float32
    np.testing.assert_array_equal(decoded.samples, np.full(4, 0.5, dtype=np.float32))
    with pytest.raises(ValueError, match="a clip given as an array needs its sample_rate"):
        DecodedAudio.from_array(stereo, None, "a clip")
    with pytest.raises(ValueError, match=r"a clip array must be mono \(samples,\) or \(samples, channels\)"):
        DecodedAudio.from_array(np.zeros((2, 2, 2)), 16000, "a clip")
