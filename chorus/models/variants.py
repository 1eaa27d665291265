"""The Chatterbox family in one table.

Every per-variant fact Chorus needs (checkpoint file names, backbone shape, token ids,
conditioning layout, sampling defaults and order, post-processing) lives here, so the rest of
the code asks a ``Variant`` instead of branching on variant names.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

BackboneKind = Literal["llama", "gpt2"]
WeightFormat = Literal["safetensors", "pt"]
# Names of the logits-processing steps; a variant lists them in the order it applies them.
SamplingStep = Literal["cfg", "repetition_penalty", "temperature", "min_p", "top_k", "top_p"]


@dataclass(frozen=True)
class Llama3RopeScaling:
    """transformers' ``rope_type="llama3"`` frequency rescaling."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class BackboneConfig:
    """Shape of the transformer stack inside T3."""

    kind: BackboneKind
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    norm_eps: float = 1e-5
    # Llama only
    rope_theta: float = 500000.0
    rope_scaling: Llama3RopeScaling | None = None
    # GPT-2 only: learned absolute positions (``wpe``) and the (unused) inner token table
    max_positions: int = 8196
    inner_vocab_size: int = 50276

    @property
    def head_dim(self) -> int:
        assert self.hidden_size % self.num_heads == 0
        return self.hidden_size // self.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads  # no variant uses grouped-query attention


@dataclass(frozen=True)
class T3Config:
    """Token ids, vocabularies and conditioning layout of T3."""

    backbone: BackboneConfig
    text_vocab_size: int
    speech_vocab_size: int
    start_text_token: int | None  # SOT; None for variants that feed raw tokenizer ids
    stop_text_token: int | None  # EOT
    start_speech_token: int = 6561  # BOS
    stop_speech_token: int = 6562  # EOS
    num_speech_codes: int = 6561  # real codes are 0..6560
    speaker_embed_size: int = 256
    speech_cond_prompt_len: int = 150
    use_perceiver: bool = True
    perceiver_queries: int = 32
    perceiver_heads: int = 4
    emotion_adv: bool = True
    # learned position tables (Llama variants); 0 means the variant has none
    text_pos_rows: int = 2050
    speech_pos_rows: int = 4100
    speech_head_bias: bool = False
    # number of BOS copies at the end of the prefill (the reference feeds EN/MTL's BOS twice)
    bos_copies: int = 2
    supports_cfg: bool = True

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def learned_positions(self) -> bool:
        return self.text_pos_rows > 0

    @property
    def cond_len_without_prompt(self) -> int:
        """Conditioning positions that do not depend on the prompt length."""
        return 1 + (1 if self.emotion_adv else 0)


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 0.8
    top_p: float = 1.0
    min_p: float = 0.05
    top_k: int = 0  # 0 disables
    repetition_penalty: float = 1.2
    cfg_weight: float = 0.5
    exaggeration: float = 0.5
    max_new_tokens: int = 1000
    # order in which the logits processors run
    order: tuple[SamplingStep, ...] = ("cfg", "repetition_penalty", "temperature", "min_p", "top_p")
    # whether the BOS token is in the repetition-penalty set on every step (EN/MTL) or only on
    # the first step (Turbo/Nano: the set is {BOS} first, then the generated tokens only)
    penalize_bos_always: bool = True


@dataclass(frozen=True)
class CheckpointFiles:
    """File names of one variant's checkpoint directory (official layout)."""

    voice_encoder: str
    t3: str
    s3gen: str
    tokenizer: tuple[str, ...]
    conds: str = "conds.pt"
    # files a variant can use but does not need (e.g. the Chinese Cangjie table)
    optional: tuple[str, ...] = ()

    @property
    def required(self) -> tuple[str, ...]:
        return (self.voice_encoder, self.t3, self.s3gen, *self.tokenizer)

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.required, self.conds, *self.optional)


@dataclass(frozen=True)
class S3GenConfig:
    meanflow: bool
    flow_steps: int
    cfg_rate: float  # inference CFG of the flow-matching decoder (0 for meanflow)


@dataclass(frozen=True)
class Variant:
    name: str
    hub_repo: str
    files: CheckpointFiles
    t3: T3Config
    s3gen: S3GenConfig
    sampling: SamplingDefaults
    tokenizer_kind: Literal["en", "mtl", "gpt2"]
    punctuation: Literal["en", "mtl", "turbo"]
    # reference-clip handling
    t3_prompt_seconds: float = 6.0
    s3gen_prompt_seconds: float = 10.0
    min_reference_seconds: float = 0.0
    loudness_lufs: float | None = None
    # speech-token post-processing before S3Gen
    filter_invalid_speech_tokens: bool = True
    append_silence_tokens: int = 0
    drop_last_token_audio: bool = False
    languages: tuple[str, ...] = ()
    description: str = ""
    aliases: tuple[str, ...] = field(default=())

    @property
    def is_multilingual(self) -> bool:
        return bool(self.languages)


LLAMA_520M = BackboneConfig(
    kind="llama", num_layers=30, hidden_size=1024, num_heads=16, intermediate_size=4096,
    rope_scaling=Llama3RopeScaling(), max_positions=131072,
)
GPT2_MEDIUM = BackboneConfig(kind="gpt2", num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096)
GPT2_SMALL = BackboneConfig(kind="gpt2", num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072)

_LLAMA_T3 = dict(start_text_token=255, stop_text_token=0, speech_vocab_size=8194)
_GPT2_T3 = dict(
    text_vocab_size=50276, speech_vocab_size=6563, start_text_token=None, stop_text_token=None,
    speech_cond_prompt_len=375, use_perceiver=False, emotion_adv=False, text_pos_rows=0,
    speech_pos_rows=0, speech_head_bias=True, bos_copies=1, supports_cfg=False,
)
_TURBO_SAMPLING = SamplingDefaults(
    temperature=0.8, top_p=0.95, min_p=0.0, top_k=1000, repetition_penalty=1.2, cfg_weight=0.0,
    exaggeration=0.0, max_new_tokens=1001, order=("temperature", "top_k", "top_p", "repetition_penalty"),
    penalize_bos_always=False,
)
MULTILINGUAL_LANGUAGES = (
    "ar", "da", "de", "el", "en", "es", "fi", "fr", "he", "hi", "it", "ja", "ko", "ms", "nl", "no",
    "pl", "pt", "ru", "sv", "sw", "tr", "zh",
)
_MTL_FILES = dict(
    voice_encoder="ve.pt", s3gen="s3gen.pt", tokenizer=("grapheme_mtl_merged_expanded_v1.json",),
    optional=("Cangjie5_TC.json",),
)
_GPT2_TOKENIZER_FILES = (
    "vocab.json", "merges.txt", "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json",
)


def _multilingual(name: str, t3_file: str, aliases: tuple[str, ...], note: str) -> Variant:
    return Variant(
        name=name, hub_repo="ResembleAI/chatterbox", aliases=aliases,
        files=CheckpointFiles(t3=t3_file, **_MTL_FILES),
        t3=T3Config(backbone=LLAMA_520M, text_vocab_size=2454, **_LLAMA_T3),
        s3gen=S3GenConfig(meanflow=False, flow_steps=10, cfg_rate=0.7),
        sampling=SamplingDefaults(), tokenizer_kind="mtl", punctuation="mtl",
        filter_invalid_speech_tokens=False, drop_last_token_audio=True,
        languages=MULTILINGUAL_LANGUAGES, description=note,
    )


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            name="original", hub_repo="ResembleAI/chatterbox", aliases=("en", "chatterbox"),
            files=CheckpointFiles(
                voice_encoder="ve.safetensors", t3="t3_cfg.safetensors", s3gen="s3gen.safetensors",
                tokenizer=("tokenizer.json",),
            ),
            t3=T3Config(backbone=LLAMA_520M, text_vocab_size=704, **_LLAMA_T3),
            s3gen=S3GenConfig(meanflow=False, flow_steps=10, cfg_rate=0.7),
            sampling=SamplingDefaults(), tokenizer_kind="en", punctuation="en",
            description="Chatterbox 0.5B, English, CFG and exaggeration",
        ),
        _multilingual("multilingual", "t3_mtl23ls_v2.safetensors", ("multilingual-v2", "mtl"),
                      "Chatterbox Multilingual (v2 T3 weights), 23 languages"),
        _multilingual("multilingual-v3", "t3_mtl23ls_v3.safetensors", ("mtl-v3",),
                      "Chatterbox Multilingual (v3 T3 weights), 23 languages"),
        Variant(
            name="turbo", hub_repo="ResembleAI/chatterbox-turbo", aliases=("chatterbox-turbo",),
            files=CheckpointFiles(
                voice_encoder="ve.safetensors", t3="t3_turbo_v1.safetensors",
                s3gen="s3gen_meanflow.safetensors", tokenizer=_GPT2_TOKENIZER_FILES,
            ),
            t3=T3Config(backbone=GPT2_MEDIUM, **_GPT2_T3),
            s3gen=S3GenConfig(meanflow=True, flow_steps=2, cfg_rate=0.0),
            sampling=_TURBO_SAMPLING, tokenizer_kind="gpt2", punctuation="turbo",
            t3_prompt_seconds=15.0, min_reference_seconds=5.0, loudness_lufs=-27.0,
            append_silence_tokens=3, description="Chatterbox Turbo 350M (GPT-2 medium), English",
        ),
        Variant(
            name="nano", hub_repo="ResembleAI/chatterbox-nano", aliases=("chatterbox-nano",),
            files=CheckpointFiles(
                voice_encoder="ve.safetensors", t3="t3_nano_v1.safetensors",
                s3gen="s3gen_meanflow.safetensors", tokenizer=_GPT2_TOKENIZER_FILES,
            ),
            t3=T3Config(backbone=GPT2_SMALL, **_GPT2_T3),
            s3gen=S3GenConfig(meanflow=True, flow_steps=2, cfg_rate=0.0),
            sampling=_TURBO_SAMPLING, tokenizer_kind="gpt2", punctuation="turbo",
            t3_prompt_seconds=15.0, min_reference_seconds=5.0, loudness_lufs=-27.0,
            append_silence_tokens=3, description="Chatterbox Nano 110M (GPT-2 small), English",
        ),
    )
}


class UnknownVariantError(ValueError):
    pass


def get_variant(name: str) -> Variant:
    """Look a variant up by name or alias (case-insensitive)."""
    key = name.strip().lower().replace("_", "-")
    for variant in VARIANTS.values():
        if key == variant.name or key in variant.aliases:
            return variant
    known = ", ".join(VARIANTS)
    raise UnknownVariantError(f"unknown variant {name!r}; choose one of: {known}")


def tiny_variant(name: str, *, layers: int = 2, hidden: int = 64, heads: int = 4) -> Variant:
    """A shrunken copy of a variant for fast tests: same ids, vocabularies and file layout,
    a small backbone. Checkpoints written for it load only with the same tiny variant."""
    base = get_variant(name)
    bb = replace(
        base.t3.backbone, num_layers=layers, hidden_size=hidden, num_heads=heads,
        intermediate_size=4 * hidden,
    )
    return replace(base, t3=replace(base.t3, backbone=bb))
