"""``chorus.server.main.memory_utilization``: each model version's KV budget on the shared device
is what the process holds there already plus its share (docs/models.md, "Memory")."""
from __future__ import annotations

import pytest
import torch

from chorus.server.model_entries import ModelEntry
from tests.server.live import server_config


def _config(tmp_path, share: float | None):
    config = server_config(tmp_path, gpu_memory_utilization=0.8,
                           models=(ModelEntry(id="m", variant="turbo", memory_share=share),))
    return config.for_entry(config.entries()[0])


def test_on_the_cpu_the_server_setting_applies(tmp_path):
    from chorus.server.main import memory_utilization

    assert memory_utilization(_config(tmp_path, 0.25), torch.device("cpu")) == 0.8


@pytest.mark.gpu
def test_a_version_gets_what_is_held_plus_its_share(tmp_path):
    from chorus.server.main import memory_utilization

    device = torch.device("cuda")
    torch.cuda.empty_cache()
    _, total = torch.cuda.mem_get_info(device)
    held = torch.empty(256 << 20, dtype=torch.uint8, device=device)  # another model's memory
    try:
        expected = torch.cuda.memory_allocated(device) / total + 0.25 * 0.8
        assert memory_utilization(_config(tmp_path, 0.25), device) == pytest.approx(expected)
    finally:
        del held
        torch.cuda.empty_cache()


@pytest.mark.gpu
def test_a_share_larger_than_the_free_memory_is_refused_with_the_numbers(tmp_path):
    from chorus.server.main import memory_utilization

    device = torch.device("cuda")
    free, total = torch.cuda.mem_get_info(device)
    held = torch.empty(int(free * 0.6), dtype=torch.uint8, device=device)  # leaves ~40% of what was free
    try:
        with pytest.raises(ValueError, match=r"model m version 1: its memory share \(1 of gpu_memory_utilization 0.8\)"):
            memory_utilization(_config(tmp_path, 1.0), device)
    finally:
        del held
        torch.cuda.empty_cache()
