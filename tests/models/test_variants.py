import pytest

from chorus.models.variants import VARIANTS, UnknownVariantError, get_variant, tiny_variant


@pytest.mark.parametrize("alias,name", [
    ("original", "original"), ("EN", "original"), ("multilingual_v2", "multilingual"),
    ("mtl-v3", "multilingual-v3"), ("Turbo", "turbo"), ("chatterbox-nano", "nano"),
])
def test_get_variant_accepts_names_and_aliases(alias, name):
    assert get_variant(alias).name == name


def test_unknown_variant_lists_the_choices():
    with pytest.raises(UnknownVariantError, match="original, multilingual"):
        get_variant("chatterbox-xl")


def test_multilingual_v2_and_v3_differ_only_in_t3_weights():
    v2, v3 = get_variant("multilingual"), get_variant("multilingual-v3")
    assert v2.files.t3 != v3.files.t3
    assert v2.t3 == v3.t3 and v2.sampling == v3.sampling and v2.files.s3gen == v3.files.s3gen


def test_gpt2_variants_have_no_cfg_and_sample_in_turbo_order():
    for name in ("turbo", "nano"):
        v = get_variant(name)
        assert not v.t3.supports_cfg and v.t3.bos_copies == 1
        assert v.sampling.order == ("temperature", "top_k", "top_p", "repetition_penalty")


def test_llama_variants_feed_bos_twice_and_use_cfg():
    for name in ("original", "multilingual"):
        v = get_variant(name)
        assert v.t3.bos_copies == 2 and v.t3.supports_cfg
        assert v.sampling.order[0] == "cfg"


def test_tiny_variant_keeps_ids_and_shrinks_backbone():
    tiny = tiny_variant("original", layers=2, hidden=64, heads=4)
    assert tiny.t3.backbone.num_layers == 2 and tiny.t3.backbone.head_dim == 16
    assert tiny.t3.text_vocab_size == VARIANTS["original"].t3.text_vocab_size
