"""The Riva gRPC door (docs/grpc.md) on a live server over tiny models, called with the
unmodified ``nvidia-riva-client`` (``riva.client.SpeechSynthesisService``): unary and streaming
synthesis, word time offsets, the config listing, zero-shot voices, encodings, every error status, a cancelled
stream that frees its KV blocks, concurrent streams, health and reflection."""
from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.conftest import DATA_DIR
from tests.engine.tiny_models import tiny
from tests.server.conftest import decode
from tests.server.live import TOKENS, EnginePause, LiveServer, aligned_live_server, metric, server_config, tiny_loader, until
from tests.voices.front_ends import tiny_front_end

riva = pytest.importorskip("riva.client")
from riva.client.proto import riva_tts_pb2  # noqa: E402
from riva.client.proto.riva_audio_pb2 import AudioEncoding  # noqa: E402

KEY = "grpc-test-key-1234"
CLIP = Path(DATA_DIR) / "sample-01.mp3"
TEXT = "Hello from the gRPC door."
LONG_TEXT = ("The first sentence is here. A second one follows it now. Then a third arrives, "
             "and a fourth sentence ends the text.")
SEED = {"seed": "3"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpc_server(voices_dir: Path, *, wait_ready: bool = True, loader_gate: threading.Event | None = None,
                max_num_seqs: int = 16, **overrides) -> LiveServer:
    config = server_config(voices_dir, grpc_port=free_port(), **overrides)
    load = tiny_loader(config, front_end=tiny_front_end(tiny(config.variant)[0]), max_num_seqs=max_num_seqs)
    if loader_gate is not None:
        inner = load

        def load(version_config=None):
            loader_gate.wait(60)
            return inner(version_config)

    return LiveServer(config, load, wait_ready=wait_ready, api_key=overrides.get("api_keys", (None,))[0])


_channels: list = []


@pytest.fixture(autouse=True)
def _close_channels():
    yield
    while _channels:
        _channels.pop().close()


def tts(server: LiveServer, key: str | None = KEY) -> "riva.SpeechSynthesisService":
    """Riva's client of ``server``'s gRPC port (its channel closed at the end of the test)."""
    auth = riva.Auth(uri=f"127.0.0.1:{server.config.grpc_port}",
                     metadata_args=[["authorization", f"Bearer {key}"]] if key else None)
    _channels.append(auth.channel)
    return riva.SpeechSynthesisService(auth)


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    with grpc_server(module_tmp_path_factory.mktemp("voices"), api_keys=(KEY,)) as live:
        yield live


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0


def test_synthesize_returns_the_whole_audio_at_the_asked_rate(server):
    reply = tts(server).synthesize(TEXT, sample_rate_hz=16_000, custom_configuration=SEED)
    http = server.speech(input=TEXT, response_format="pcm", seed=3)
    assert http.status_code == 200, http.text
    seconds = len(http.content) / 2 / 24_000
    assert len(reply.audio) / 2 / 16_000 == pytest.approx(seconds, abs=0.01) and seconds > 0.1


def test_synthesize_echoes_the_request_id(server):
    service = tts(server)
    request = riva_tts_pb2.SynthesizeSpeechRequest(text=TEXT, encoding=AudioEncoding.LINEAR_PCM, sample_rate_hz=24000)
    request.id.value = "my-request-7"
    reply = service.stub.Synthesize(request, metadata=service.auth.get_auth_metadata())
    assert reply.id.value == "my-request-7" and reply.audio


def test_synthesize_online_streams_the_same_audio_in_pieces(server):
    service = tts(server)
    pieces = [r.audio for r in service.synthesize_online(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED)]
    whole = service.synthesize(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED).audio
    assert len(pieces) > 1 and b"".join(pieces) == whole


def test_synthesize_online_speaks_each_request_of_its_stream_in_turn(server):
    service = tts(server)
    texts = ["One short line.", "And another."]
    streamed = b"".join(r.audio for r in service.synthesize_online(texts, sample_rate_hz=24_000,
                                                                    custom_configuration=SEED))
    each = [service.synthesize(t, sample_rate_hz=24_000, custom_configuration=SEED).audio for t in texts]
    assert streamed == b"".join(each)


def test_config_lists_the_model_its_language_and_voices(server):
    service = tts(server)
    reply = service.stub.GetRivaSynthesisConfig(riva_tts_pb2.RivaSynthesisConfigRequest(),
                                                metadata=service.auth.get_auth_metadata())
    [config] = reply.model_config
    assert config.model_name == "chatterbox-turbo" and config.parameters["language_code"] == "en-US"
    assert config.parameters["voice_name"] == "chatterbox-turbo"
    assert config.parameters["subvoices"].split(",")[0] == "default:0"  # the built-in voice first


def test_a_listed_voice_name_speaks_the_built_in_voice(server):
    service = tts(server)
    named = service.synthesize(TEXT, voice_name="chatterbox-turbo.default", custom_configuration=SEED).audio
    assert named == service.synthesize(TEXT, custom_configuration=SEED).audio


def test_a_zero_shot_clip_speaks_in_its_voice_and_is_not_kept(server):
    service = tts(server)
    before = server.client.get("/v1/voices").json()["data"]
    cloned = service.synthesize(TEXT, zero_shot_audio_prompt_file=CLIP, custom_configuration=SEED).audio
    default = service.synthesize(TEXT, custom_configuration=SEED).audio
    assert cloned and cloned != default
    assert server.client.get("/v1/voices").json()["data"] == before


def test_a_library_voice_speaks_by_its_name_and_is_listed(server):
    upload = server.client.post("/v1/voices", files={"file": ("clip.mp3", CLIP.read_bytes())},
                                data={"name": "narrator"})
    assert upload.status_code == 201, upload.text
    voice_id = upload.json()["id"]
    service = tts(server)
    by_name = service.synthesize(TEXT, voice_name="narrator", custom_configuration=SEED).audio
    by_id = service.synthesize(TEXT, voice_name=f"chatterbox-turbo.{voice_id}", custom_configuration=SEED).audio
    listed = service.stub.GetRivaSynthesisConfig(riva_tts_pb2.RivaSynthesisConfigRequest(),
                                                 metadata=service.auth.get_auth_metadata())
    assert by_name == by_id and f"{voice_id}:" in listed.model_config[0].parameters["subvoices"]


def test_a_zero_shot_clip_that_is_not_audio_is_invalid_argument(server, tmp_path):
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all" * 100)
    with pytest.raises(grpc.RpcError) as caught:
        tts(server).synthesize(TEXT, zero_shot_audio_prompt_file=junk)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("zero_shot_data.audio_prompt: ")


@pytest.mark.parametrize("encoding, rate, bytes_per_sample", [(AudioEncoding.MULAW, 8000, 1),
                                                               (AudioEncoding.ALAW, 8000, 1),
                                                               (AudioEncoding.LINEAR_PCM, 22050, 2)])
def test_raw_encodings_have_one_sample_per_step_at_the_asked_rate(server, encoding, rate, bytes_per_sample):
    audio = tts(server).synthesize(TEXT, encoding=encoding, sample_rate_hz=rate, custom_configuration=SEED).audio
    reference = tts(server).synthesize(TEXT, sample_rate_hz=24_000, custom_configuration=SEED).audio
    assert len(audio) / bytes_per_sample / rate == pytest.approx(len(reference) / 2 / 24_000, abs=0.01)


@pytest.mark.parametrize("encoding, fmt", [(AudioEncoding.FLAC, "flac"), (AudioEncoding.OGGOPUS, "opus")])
def test_codec_encodings_decode_to_the_speech(server, encoding, fmt):
    audio = tts(server).synthesize(TEXT, encoding=encoding, sample_rate_hz=24_000, custom_configuration=SEED).audio
    samples, rate = decode(fmt, audio)
    reference = pcm(tts(server).synthesize(TEXT, sample_rate_hz=24_000, custom_configuration=SEED).audio)
    assert samples.size / rate == pytest.approx(reference.size / 24_000, abs=0.05)


def _words(responses) -> list[tuple[str, int, int]]:
    return [(w.word, w.start_time, w.end_time) for r in responses for w in r.meta.words]


def test_word_time_offsets_time_every_word_in_order_inside_the_audio(server):
    reply = tts(server).synthesize(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED,
                                   enable_word_time_offsets=True)
    words = _words([reply])
    assert [w for w, _, _ in words] == LONG_TEXT.split()
    audio_ms = len(reply.audio) / 2 / 24_000 * 1000
    ended = 0
    for _, start, end in words:  # milliseconds, monotonic, every word a positive interval
        assert ended <= start < end <= audio_ms + 1
        ended = end


def test_streamed_word_time_offsets_equal_the_unary_ones_and_come_with_their_audio(server):
    service = tts(server)
    responses = list(service.synthesize_online(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED,
                                               enable_word_time_offsets=True))
    whole = service.synthesize(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED,
                               enable_word_time_offsets=True)
    assert _words(responses) == _words([whole])
    assert sum(1 for r in responses if r.meta.words) > 1  # the chunks' words go out as their audio does
    audio_ms = 0.0
    for response in responses:  # a response's words are of audio sent by then
        audio_ms += len(response.audio) / 2 / 24_000 * 1000
        assert all(w.end_time <= audio_ms + 1 for w in response.meta.words)


def test_word_time_offsets_name_their_method_in_the_trailing_metadata(server):
    service = tts(server)
    request = riva_tts_pb2.SynthesizeSpeechRequest(text=TEXT, encoding=AudioEncoding.LINEAR_PCM, sample_rate_hz=24000,
                                                   enable_word_time_offsets=True)
    _, call = service.stub.Synthesize.with_call(request, metadata=service.auth.get_auth_metadata())
    assert dict(call.trailing_metadata())["chorus-timestamps-method"] == "estimate"


def test_word_time_offsets_of_an_original_model_with_the_alignment_heads_name_alignment(module_tmp_path_factory):
    with aligned_live_server(module_tmp_path_factory.mktemp("voices-original"), grpc_port=free_port()) as live:
        service = tts(live, key=None)
        request = riva_tts_pb2.SynthesizeSpeechRequest(text=TEXT, encoding=AudioEncoding.LINEAR_PCM,
                                                       sample_rate_hz=24000, enable_word_time_offsets=True)
        reply, call = service.stub.Synthesize.with_call(request, metadata=service.auth.get_auth_metadata())
    assert dict(call.trailing_metadata())["chorus-timestamps-method"] == "alignment"
    assert [w for w, _, _ in _words([reply])] == TEXT.split()


def test_without_word_time_offsets_no_words_are_sent(server):
    service = tts(server)
    responses = [service.synthesize(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED),
                 *service.synthesize_online(LONG_TEXT, sample_rate_hz=24_000, custom_configuration=SEED)]
    assert _words(responses) == [] and all(not r.HasField("meta") for r in responses)


def _error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        reply = call()
        if not hasattr(reply, "audio"):  # a stream: read it
            list(reply)
    return caught.value


def test_a_bad_knob_value_is_invalid_argument_naming_its_key(server):
    error = _error(lambda: tts(server).synthesize(TEXT, custom_configuration={"temperature": "hot"}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("custom_configuration.temperature: ")


def test_a_knob_out_of_range_is_invalid_argument_naming_its_key(server):
    error = _error(lambda: tts(server).synthesize(TEXT, custom_configuration={"speed": "9"}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("custom_configuration.speed: ")


def test_an_unknown_voice_is_invalid_argument_naming_voice_name(server):
    error = _error(lambda: tts(server).synthesize(TEXT, voice_name="nobody"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith("voice_name: ")


def test_a_missing_api_key_is_unauthenticated(server):
    error = _error(lambda: tts(server, key=None).synthesize_online(TEXT))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_full_queue_is_resource_exhausted_with_a_retry_delay(module_tmp_path_factory):
    with grpc_server(module_tmp_path_factory.mktemp("full"), max_queue=1) as server:
        service = tts(server, key=None)
        with EnginePause(server) as pause:
            first = service.synthesize(TEXT, future=True)
            until(pause.entered.is_set, what="the first request in the engine")
            error = _error(lambda: service.synthesize(TEXT))
        assert first.result().audio
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert float(dict(error.trailing_metadata())["retry-after"]) > 0


def test_the_client_deadline_is_deadline_exceeded_and_frees_the_request(server):
    service = tts(server)
    request = riva_tts_pb2.SynthesizeSpeechRequest(text=TEXT, encoding=AudioEncoding.LINEAR_PCM, sample_rate_hz=24000)
    with EnginePause(server) as pause:
        call = service.stub.Synthesize.future(request, timeout=2.0, metadata=service.auth.get_auth_metadata())
        until(pause.entered.is_set, what="the request in the engine")
        with pytest.raises(grpc.RpcError) as caught:
            call.result()
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    server.wait_idle()


def test_cancelling_a_stream_mid_way_frees_its_kv_blocks(module_tmp_path_factory):
    # one T3 row: the text's chunks run one after another, and T3 is held once two chunks are
    # done (the first chunk's audio is out), so the request is still running at the cancel
    with grpc_server(module_tmp_path_factory.mktemp("cancel"), max_num_seqs=1) as server:
        server.wait_idle()
        with EnginePause(server, after_tokens=2 * TOKENS):
            replies = tts(server, key=None).synthesize_online(LONG_TEXT * 2)
            assert next(replies).audio
            replies.cancel()
            until(lambda: _count(server, "client_disconnected") == 1, what="the cancel to be counted")
            until(lambda: server.pipeline.active_requests == 0, what="the request to leave the pipeline")
        server.wait_idle()
        assert server.pipeline.engine_stats(5.0).kv.num_used_blocks == 0


def _count(server: LiveServer, status: str) -> float:
    return metric(server.client.get("/metrics").text, "chorus_requests_total", f'status="{status}"')


def test_concurrent_streams_each_get_their_own_audio(server):
    def speak(index: int) -> list:
        service = tts(server)
        request = riva_tts_pb2.SynthesizeSpeechRequest(text=TEXT, encoding=AudioEncoding.LINEAR_PCM,
                                                       sample_rate_hz=24000)
        request.id.value = f"stream-{index}"
        return list(service.stub.SynthesizeOnline(iter([request]), metadata=service.auth.get_auth_metadata()))

    with ThreadPoolExecutor(4) as pool, EnginePause(server) as pause:
        streams = [pool.submit(speak, index) for index in range(4)]
        until(lambda: server.service.admission.in_flight == 4, what="four streams in flight at once")
        pause.release.set()
        replies = [stream.result() for stream in streams]
    for index, pieces in enumerate(replies):
        assert pieces and {piece.id.value for piece in pieces} == {f"stream-{index}"}
        assert sum(len(piece.audio) for piece in pieces) > 0
    server.wait_idle()


def test_loading_is_unavailable_and_not_serving_until_ready(module_tmp_path_factory):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    gate = threading.Event()
    with grpc_server(module_tmp_path_factory.mktemp("loading"), wait_ready=False, loader_gate=gate) as server:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.config.grpc_port}")
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        error = _error(lambda: tts(server, key=None).synthesize(TEXT))
        listing = _error(lambda: tts(server, key=None).stub.GetRivaSynthesisConfig(
            riva_tts_pb2.RivaSynthesisConfigRequest()))
        gate.set()
        until(lambda: server.client.get("/ready").status_code == 200, what="ready")
        serving = health.Check(health_pb2.HealthCheckRequest(service="nvidia.riva.tts.RivaSpeechSynthesis"))
        channel.close()
    assert error.code() == listing.code() == grpc.StatusCode.UNAVAILABLE
    assert serving.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_describes_the_riva_service(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(f"127.0.0.1:{server.config.grpc_port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        file = database.FindFileContainingSymbol("nvidia.riva.tts.RivaSpeechSynthesis")
    assert "nvidia.riva.tts.RivaSpeechSynthesis" in services and "grpc.health.v1.Health" in services
    assert file.name == "riva/proto/riva_tts.proto"


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chorus-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_a_certificate_serves_tls(module_tmp_path_factory):
    pytest.importorskip("cryptography")
    directory = module_tmp_path_factory.mktemp("tls")
    cert, key = _self_signed(directory)
    with grpc_server(directory, grpc_tls_cert=str(cert), grpc_tls_key=str(key)) as server:
        auth = riva.Auth(uri=f"127.0.0.1:{server.config.grpc_port}", use_ssl=True, ssl_root_cert=cert)
        _channels.append(auth.channel)
        reply = riva.SpeechSynthesisService(auth).synthesize(TEXT)
    assert reply.audio


def test_a_stream_in_flight_finishes_at_shutdown_and_new_ones_are_unavailable(module_tmp_path_factory):
    with grpc_server(module_tmp_path_factory.mktemp("drain")) as server:
        service = tts(server, key=None)
        with EnginePause(server) as pause:
            stream = service.synthesize_online(TEXT, sample_rate_hz=24_000, custom_configuration=SEED)
            until(pause.entered.is_set, what="the stream in the engine")
            server.begin_shutdown()
            until(lambda: server.service.state == "draining", what="the drain")
            refused = _error(lambda: service.synthesize(TEXT))
            pause.release.set()
            audio = b"".join(piece.audio for piece in stream)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert len(audio) / 2 / 24_000 > 0.1  # the whole stream, not a cut

