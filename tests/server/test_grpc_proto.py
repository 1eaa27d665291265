"""The gRPC door's protos and its pieces that need no server: the committed descriptor set is
what the .proto files compile to, it matches NVIDIA's generated Riva stubs message by message,
language codes map onto the models' languages, G.711 encoders invert exactly, and the config's
gRPC settings are checked."""
from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import descriptor_pb2

from chorus.audio.pcm import from_alaw, from_mulaw, to_alaw, to_mulaw
from chorus.server.config import ServerConfig
from chorus.server.errors import APIError

grpc_tools = pytest.importorskip("grpc_tools.protoc")
messages = pytest.importorskip("chorus.server.grpc.messages")


def _committed() -> descriptor_pb2.FileDescriptorSet:
    return descriptor_pb2.FileDescriptorSet.FromString(messages.DESCRIPTOR_SET.read_bytes())


def test_the_committed_descriptor_set_is_what_the_protos_compile_to(tmp_path):
    out = tmp_path / "riva_tts.binpb"
    status = grpc_tools.main(["protoc", f"-I{messages.PROTO_DIR}", "--include_imports", f"--descriptor_set_out={out}",
                              "riva/proto/riva_tts.proto"])
    assert status == 0
    assert descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()) == _committed(), \
        "rebuild proto/riva_tts.binpb (the command is in chorus/server/grpc/messages.py)"


@pytest.mark.parametrize("name", ["riva_tts", "riva_audio", "riva_common"])
def test_each_proto_file_matches_nvidias_generated_stubs(name):
    import importlib

    riva = importlib.import_module(f"riva.client.proto.{name}_pb2")
    theirs = descriptor_pb2.FileDescriptorProto()
    riva.DESCRIPTOR.CopyToProto(theirs)
    [ours] = [f for f in _committed().file if f.name == f"riva/proto/{name}.proto"]
    for message in ours.message_type:  # protoc records JSON names that the stubs leave out
        _drop_json_names(message)
    assert ours == theirs


MULTILINGUAL = [{"id": "chatterbox-multilingual", "languages": ["en", "fr", "de"]}]
ENGLISH = [{"id": "chatterbox-turbo", "languages": []}]


def _parse(models, **fields):
    from chorus.server.grpc.requests import parse

    return parse(messages.SynthesizeSpeechRequest(text="Bonjour.", **fields), models, None, 300.0).body


def test_a_multilingual_model_speaks_the_language_of_a_riva_language_code():
    assert _parse(MULTILINGUAL, language_code="fr-FR").language == "fr"


def test_an_english_model_takes_english_codes_and_refuses_others_naming_language_code():
    assert _parse(ENGLISH, language_code="en-US").language is None
    with pytest.raises(APIError) as refused:
        _parse(ENGLISH, language_code="fr-FR")
    assert refused.value.param == "language_code"


def test_voice_name_may_name_the_model_and_knobs_are_typed():
    body = _parse(ENGLISH, voice_name="chatterbox-turbo.narrator", custom_configuration={"seed": "7", "top_p": "0.5"})
    assert (body.model, body.voice, body.seed, body.top_p) == ("chatterbox-turbo", "narrator", 7, 0.5)


def _drop_json_names(message) -> None:
    for field in message.field:
        field.ClearField("json_name")
    for nested in message.nested_type:
        _drop_json_names(nested)


@pytest.mark.parametrize("encode, decode", [(to_alaw, from_alaw), (to_mulaw, from_mulaw)])
def test_g711_codes_decode_and_encode_back_to_themselves(encode, decode):
    codes = np.arange(256, dtype=np.uint8)
    again = encode(decode(codes).astype(np.float32) / 32767.0)
    assert (again == codes).mean() >= 255 / 256  # mu-law's two zeros (0x7F, 0xFF) meet at one


@pytest.mark.parametrize("encode, decode", [(to_alaw, from_alaw), (to_mulaw, from_mulaw)])
def test_g711_keeps_a_sine_within_its_quantisation(encode, decode):
    sine = (0.5 * np.sin(np.linspace(0, 40 * np.pi, 8000))).astype(np.float32)
    back = decode(encode(sine)).astype(np.float32) / 32767.0
    assert np.abs(back - sine).max() < 0.02


def test_grpc_port_needs_one_replica():
    with pytest.raises(ValueError, match="replicas 1"):
        ServerConfig(grpc_port=50051, replicas="2")


def test_grpc_port_differs_from_the_http_port():
    with pytest.raises(ValueError, match="differ from port"):
        ServerConfig(grpc_port=8000, port=8000)


def test_a_tls_certificate_needs_its_key():
    with pytest.raises(ValueError, match="go together"):
        ServerConfig(grpc_port=50051, grpc_tls_cert="cert.pem")


def test_grpc_port_without_the_extra_is_one_line_naming_it(monkeypatch, capsys):
    import sys

    from chorus.cli import main

    monkeypatch.setitem(sys.modules, "grpc_reflection.v1alpha.reflection", None)  # as if not installed
    assert main(["serve", "--grpc-port", "50051"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("chorus: error: --grpc-port: ") and "chorus-tts[grpc]" in error
