"""Tiny random S3Gen models shared by the vocoder-stage tests (built once per session)."""
from __future__ import annotations

import pytest
import torch

from tests.models.s3gen.oracle_s3gen import torch_threads
from tests.vocoder.models import random_s3gen


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def tiny_turbo():
    return random_s3gen("turbo", seed=3)


@pytest.fixture(scope="session")
def tiny_original():
    return random_s3gen("original", seed=3)


@pytest.fixture(scope="session")
def tiny_models(tiny_turbo, tiny_original):
    return {"turbo": tiny_turbo, "original": tiny_original}


def drain(stage) -> dict[str, list]:
    """Step until the stage has no work; every job's pieces in order."""
    pieces: dict[str, list] = {}
    while stage.has_work():
        for out in stage.step():
            pieces.setdefault(out.job_id, []).append(out)
    return pieces


def joined(pieces) -> torch.Tensor:
    return torch.cat([p.samples for p in pieces])
