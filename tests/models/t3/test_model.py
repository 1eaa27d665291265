import os
import re

import pytest
import torch

from chorus.models.checkpoint import CheckpointMismatchError
from chorus.models.t3 import T3Model
from chorus.models.variants import get_variant, tiny_variant
from tests.conftest import DATA_DIR
from tests.models.t3.weights import random_t3_state

REFERENCE_KEY_FILES = {
    "original": "t3en.txt", "multilingual": "t3mtl.txt", "multilingual-v3": "t3mtl.txt",
    "turbo": "t3turbo.txt", "nano": "t3nano.txt",
}
LINE = re.compile(r"^\s+(\S+) \(([\d, ]*)\) torch\.\w+$")


def _reference_shapes(file_name: str) -> dict[str, tuple[int, ...]]:
    shapes = {}
    with open(os.path.join(DATA_DIR, "reference_keys", file_name)) as f:
        for line in f:
            match = LINE.match(line)
            if match:
                shapes[match[1]] = tuple(int(x) for x in match[2].replace(",", " ").split())
    return shapes


@pytest.fixture(scope="module")
def tiny_original():
    config = tiny_variant("original").t3
    state = random_t3_state(config)
    return config, state, T3Model.from_state_dict(config, state)


@pytest.mark.parametrize("name", sorted(REFERENCE_KEY_FILES))
def test_checkpoint_shapes_match_reference_keys(name):
    expected = _reference_shapes(REFERENCE_KEY_FILES[name])
    assert len(expected) in (155, 292, 299)
    assert T3Model.checkpoint_shapes(get_variant(name).t3) == expected


@pytest.mark.parametrize("name", ["original", "turbo", "nano"])
def test_module_keys_are_checkpoint_keys_without_unused_ones(name):
    config = get_variant(name).t3
    with torch.device("meta"):
        model = T3Model(config)
    module_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    official = T3Model.checkpoint_shapes(config)
    unused = set(T3Model.unused_checkpoint_keys(config))
    assert unused <= set(official)
    assert module_shapes == {k: v for k, v in official.items() if k not in unused}


def test_unused_tables_are_dropped_on_load(tiny_original):
    _, _, model = tiny_original
    keys = set(model.state_dict())
    assert "text_head.weight" not in keys and "tfmr.embed_tokens.weight" not in keys
    assert not hasattr(model, "text_head")


def test_loaded_weights_are_the_checkpoint_values(tiny_original):
    _, state, model = tiny_original
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_missing_key_is_reported(tiny_original):
    config, state, _ = tiny_original
    broken = dict(state)
    del broken["tfmr.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \(1\)[\s\S]*layers\.1\.mlp\.up_proj"):
        T3Model.from_state_dict(config, broken, source="t3_cfg.safetensors")


def test_unexpected_key_is_reported(tiny_original):
    config, state, _ = tiny_original
    broken = dict(state, **{"tfmr.layers.9.extra": torch.zeros(1)})
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys \(1\)[\s\S]*tfmr\.layers\.9\.extra"):
        T3Model.from_state_dict(config, broken)


def test_unused_key_is_still_required(tiny_original):
    config, state, _ = tiny_original
    broken = {k: v for k, v in state.items() if k != "text_head.weight"}
    with pytest.raises(CheckpointMismatchError, match="text_head.weight"):
        T3Model.from_state_dict(config, broken)


def test_wrong_shape_is_reported_with_both_shapes(tiny_original):
    config, state, _ = tiny_original
    broken = dict(state, **{"speech_emb.weight": torch.zeros(100, config.hidden_size)})
    expected = r"speech_emb\.weight: expected \[8194, 64\], found \[100, 64\]"
    with pytest.raises(CheckpointMismatchError, match=expected):
        T3Model.from_state_dict(config, broken)


def test_full_size_checkpoint_does_not_load_into_tiny_config():
    full = get_variant("nano").t3
    with torch.device("meta"):
        state = {k: torch.empty(s) for k, s in T3Model.checkpoint_shapes(full).items()}
    with pytest.raises(CheckpointMismatchError):
        T3Model.from_state_dict(tiny_variant("nano").t3, state)


def test_dtype_is_converted_once_and_model_is_frozen(tiny_original):
    config, state, fp32 = tiny_original
    bf16 = T3Model.from_state_dict(config, state, dtype=torch.bfloat16)
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    assert bf16.tfmr.rotary.inv_freq.dtype == torch.float32  # positions stay exact
    assert not bf16.training and not any(p.requires_grad for p in bf16.parameters())
    cond32 = fp32.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, 9)), 0.5)
    cond16 = bf16.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, 9)), 0.5)
    assert cond16.dtype == torch.bfloat16 and cond32.dtype == torch.float32


def test_bf16_logits_track_fp32(tiny_original):
    from chorus.models.t3 import T3SingleSequence

    config, state, fp32 = tiny_original
    bf16 = T3Model.from_state_dict(config, state, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    speaker, prompt = torch.randn(1, 256, generator=g), torch.randint(0, 6561, (1, 9), generator=g)
    text = torch.randint(1, 255, (6,), generator=g)
    logits = []
    for model in (fp32, bf16):
        cond = model.encode_conditioning(speaker, prompt, 0.5)
        runner = T3SingleSequence(model, cond, text, cfg=True, max_new_tokens=2)
        logits.append(runner.prefill().float())
    assert torch.isfinite(logits[1]).all()
    assert float((logits[0] - logits[1]).abs().max()) < 0.05 * float(logits[0].abs().max())


# ---- conditioning and input assembly ---------------------------------------------------------

def test_conditioning_layout_original(tiny_original):
    config, _, model = tiny_original
    speaker = torch.randn(1, 256)
    with_prompt = model.encode_conditioning(speaker, torch.randint(0, 6561, (1, 40)), 0.5)
    without = model.encode_conditioning(speaker, None, 0.5)
    assert with_prompt.shape == (1, 1 + config.perceiver_queries + 1, config.hidden_size)
    assert without.shape == (1, 2, config.hidden_size)
    torch.testing.assert_close(with_prompt[:, [0, -1]], without)


def test_precomputed_prompt_embedding_is_used_as_is(tiny_original):
    _, _, model = tiny_original
    speaker, tokens = torch.randn(1, 256), torch.randint(0, 6561, (1, 12))
    from_tokens = model.encode_conditioning(speaker, tokens, 0.5)
    embeds = model.prompt_embeds(tokens)
    assert torch.equal(model.encode_conditioning(speaker, None, 0.5, prompt_embeds=embeds), from_tokens)
    other = model.encode_conditioning(speaker, tokens, 0.5, prompt_embeds=embeds + torch.randn_like(embeds))
    assert not torch.allclose(other, from_tokens)


def test_conditioning_layout_turbo():
    config = tiny_variant("turbo").t3
    model = T3Model.from_state_dict(config, random_t3_state(config))
    tokens = torch.randint(0, 6561, (1, 17))
    cond = model.encode_conditioning(torch.randn(1, 256), tokens, 0.0)
    assert cond.shape == (1, 18, config.hidden_size)
    torch.testing.assert_close(cond[0, 1:], model.speech_emb(tokens[0]))


def test_prefill_layout_original_with_cfg(tiny_original):
    config, _, model = tiny_original
    cond = model.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, 8)), 0.5)
    text = torch.tensor([5, 6, 7])
    embeds = model.prefill_embeds(cond, text, cfg=True)
    c, framed = cond.shape[1], 3 + 2
    assert embeds.shape == (2, c + framed + 2, config.hidden_size)
    assert torch.equal(embeds[0, :c], cond[0]) and torch.equal(embeds[1, :c], cond[0])
    text_pos = model.text_pos_emb.emb.weight[:framed]
    ids = torch.tensor([config.start_text_token, 5, 6, 7, config.stop_text_token])
    torch.testing.assert_close(embeds[0, c:c + framed], model.text_emb(ids) + text_pos)
    torch.testing.assert_close(embeds[1, c:c + framed], text_pos)  # uncond: positions only
    bos = model.speech_emb.weight[config.start_speech_token] + model.speech_pos_emb.emb.weight[0]
    for row in range(2):
        torch.testing.assert_close(embeds[row, -2:], bos.expand(2, -1))


def test_prefill_layout_turbo_has_raw_text_and_one_bos():
    config = tiny_variant("turbo").t3
    model = T3Model.from_state_dict(config, random_t3_state(config))
    cond = model.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, 5)), 0.0)
    text = torch.tensor([464, 2068, 318])
    embeds = model.prefill_embeds(cond, text, cfg=False)
    assert embeds.shape == (1, 6 + 3 + 1, config.hidden_size)
    torch.testing.assert_close(embeds[0, 6:9], model.text_emb(text))
    torch.testing.assert_close(embeds[0, -1], model.speech_emb.weight[config.start_speech_token])


def _one_by_one(model, requests):
    """Each request's prompt embeddings computed alone, as a burst of one."""
    return [model.prefill_embeds_many([r])[0] for r in requests]


@pytest.mark.parametrize("name", ["original", "turbo"])
def test_prompt_embeddings_of_a_burst_equal_each_alone_bitwise(name):
    config = tiny_variant(name).t3
    model = T3Model.from_state_dict(config, random_t3_state(config))
    cfg = config.supports_cfg
    conds = [model.encode_conditioning(torch.randn(1, 256), torch.randint(0, 6561, (1, n)), 0.5 if cfg else 0.0)
             for n in (4, 9)]
    requests = [(conds[i % 2], torch.randint(1, 200, (n,)), cfg and i % 3 == 0) for i, n in enumerate((3, 1, 7, 12, 5))]
    together = model.prefill_embeds_many(requests)
    for got, alone, (cond, text, guided) in zip(together, _one_by_one(model, requests), requests):
        assert torch.equal(got, alone)
        assert torch.equal(got, model.prefill_embeds(cond, text, cfg=guided))
        assert got.shape[0] == (2 if guided else 1)


def test_a_burst_looks_its_text_up_once(tiny_original):
    """A burst's text goes through each embedding table once, however many requests it has
    (the engine admits bursts of hundreds, docs/engine.md, "Admission")."""
    from torch.overrides import TorchFunctionMode

    _, _, model = tiny_original
    cond = model.encode_conditioning(torch.randn(1, 256), None, 0.5)

    class Lookups(TorchFunctionMode):
        count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Lookups.count += func is torch.nn.functional.embedding
            return func(*args, **(kwargs or {}))

    def lookups(n: int) -> int:
        Lookups.count = 0
        with Lookups():
            model.prefill_embeds_many([(cond, torch.tensor([5, 6, 7 + i]), True) for i in range(n)])
        return Lookups.count

    assert lookups(16) == lookups(2) > 0


def test_a_burst_with_one_bad_request_is_refused_whole(tiny_original):
    """The batch is all or nothing; the engine admits a burst's requests one by one when it
    fails (tests/engine)."""
    config, _, model = tiny_original
    cond = model.encode_conditioning(torch.randn(1, 256), None, 0.5)
    too_long = torch.ones(config.text_pos_rows, dtype=torch.long)
    with pytest.raises(ValueError, match="text positions"):
        model.prefill_embeds_many([(cond, torch.tensor([1, 2]), False), (cond, too_long, False)])
    assert model.prefill_embeds_many([]) == []


def test_cfg_is_refused_by_variants_without_it():
    config = tiny_variant("nano").t3
    model = T3Model.from_state_dict(config, random_t3_state(config))
    cond = model.encode_conditioning(torch.randn(1, 256), None, 0.0)
    with pytest.raises(ValueError, match="classifier-free guidance"):
        model.prefill_embeds(cond, torch.tensor([1, 2]), cfg=True)


def test_too_long_text_is_refused(tiny_original):
    config, _, model = tiny_original
    cond = model.encode_conditioning(torch.randn(1, 256), None, 0.5)
    with pytest.raises(ValueError, match="text positions"):
        model.prefill_embeds(cond, torch.ones(config.text_pos_rows, dtype=torch.long), cfg=False)


def test_decode_embedding_uses_speech_position(tiny_original):
    _, _, model = tiny_original
    got = model.speech_embeds(torch.tensor([42, 42]), torch.tensor([1, 5]))
    table = model.speech_pos_emb.emb.weight
    torch.testing.assert_close(got, model.speech_emb.weight[42] + table[[1, 5]])
