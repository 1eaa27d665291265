"""An engine with FP8 linears on a GPU: graphs captured, and the same tokens as eager steps."""
from __future__ import annotations

import pytest
import torch

from tests.engine.test_engine_gpu import _requests
from tests.engine.test_fp8_linears import _engine, _model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="FP8 GEMMs need compute capability 8.9+"),
]


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_an_fp8_engine_captures_graphs_and_decodes_as_its_eager_steps(name):
    variant, model = _model(name, device="cuda", dtype=torch.bfloat16)
    reqs = _requests(variant, model, 5)
    graphed = _engine(variant, model, True, cuda_graphs=True)
    assert graphed.runner.graphs is not None
    got_graph = [r.tokens for r in graphed.generate(reqs)]
    assert all(len(tokens) > 0 for tokens in got_graph)
    assert got_graph == [r.tokens for r in _engine(variant, model, True, cuda_graphs=False).generate(reqs)]
