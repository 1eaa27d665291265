"""A module-wide live server over tiny turbo models, and audio decoding for responses."""
from __future__ import annotations

import io

import av
import numpy as np
import pytest

from tests.server.live import LiveServer, server_config, tiny_loader


@pytest.fixture(scope="module")
def server(module_tmp_path_factory):
    config = server_config(module_tmp_path_factory.mktemp("voices"))
    with LiveServer(config, tiny_loader(config)) as live:
        yield live


def decode(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    """Mono float samples and rate of a response body in ``fmt``."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0, 24_000
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        frames = [f.to_ndarray() for f in container.decode(stream)]
    samples = np.concatenate([f.reshape(f.shape[0], -1)[0] if f.ndim > 1 else f for f in frames]) if frames else np.zeros(0)
    if samples.dtype.kind == "i":
        samples = samples.astype(np.float32) / np.iinfo(samples.dtype).max
    return samples.astype(np.float32), rate
