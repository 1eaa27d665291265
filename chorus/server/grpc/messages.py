"""Riva's speech-synthesis messages, from the descriptor set compiled from ``proto/`` (no
generated Python). They live in a pool of their own, so a process that also imports NVIDIA's
generated stubs (``riva.client``) holds both without a clash; on the wire they are the same.
``proto/riva_tts.binpb`` is rebuilt with::

    python -m grpc_tools.protoc -I chorus/server/grpc/proto --include_imports \\
        --descriptor_set_out=chorus/server/grpc/proto/riva_tts.binpb riva/proto/riva_tts.proto

(tests/server/test_grpc_proto.py checks it matches the .proto files).
"""
from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO_DIR = Path(__file__).parent / "proto"
DESCRIPTOR_SET = PROTO_DIR / "riva_tts.binpb"
SERVICE = "nvidia.riva.tts.RivaSpeechSynthesis"
RIVA_VERSION = "2.28"  # the Riva release whose riva_tts.proto this follows

pool = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes()).file:
    pool.Add(_file)


def _message(name: str):
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


SynthesizeSpeechRequest = _message("nvidia.riva.tts.SynthesizeSpeechRequest")
SynthesizeSpeechResponse = _message("nvidia.riva.tts.SynthesizeSpeechResponse")
RivaSynthesisConfigRequest = _message("nvidia.riva.tts.RivaSynthesisConfigRequest")
RivaSynthesisConfigResponse = _message("nvidia.riva.tts.RivaSynthesisConfigResponse")
_encoding = pool.FindEnumTypeByName("nvidia.riva.AudioEncoding")
ENCODINGS = {value.number: value.name for value in _encoding.values}  # number -> name (LINEAR_PCM, ...)
