"""S3Gen end to end: speech tokens -> 24 kHz waveforms, for a batch of items of any lengths.

``S3Gen`` owns the token->mel flow and the HiFT vocoder of one checkpoint file (``s3gen.*``),
and optionally the two models that turn a reference clip into S3Gen conditioning (the S3
tokenizer and CAMPPlus, used by :mod:`chorus.voices.builder`). Per item it reproduces the
reference entry classes: the variant's token clean-up (see :func:`postprocess_speech_tokens`),
the flow with the voice's prompt tokens, prompt mel and x-vector, the vocoder, the 40 ms
trim/fade at the start and, for the multilingual variants, the cut of the last token's audio.

Randomness (flow noise, the vocoder's harmonic phases and noise) comes from per-item seeds, drawn
in the reference's order: for one item, ``seed`` gives the waveform the reference gives after
``torch.manual_seed(seed)`` on the same device, and an item's audio does not depend on the rest
of the batch.
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import nn

from chorus.models.campplus import CAMPPlus
from chorus.models.checkpoint import CheckpointMismatchError, KeyReport, compare_state_dict
from chorus.models.s3gen.flow import FlowConfig, FlowDecoder
from chorus.models.s3gen.hift import HiFTGenerator, draw_source_noise
from chorus.models.s3gen.postprocess import apply_trim_fade
from chorus.models.s3tokenizer import S3TokenizerV2
from chorus.models.variants import Variant

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = 960  # 25 tokens/s at 24 kHz
SILENCE_TOKEN = 4299  # the reference's S3GEN_SIL, appended by Turbo/Nano

TokenSeq = Sequence[int] | torch.Tensor


@dataclass(frozen=True)
class TokenRules:
    """What a variant's entry class does to T3's tokens before S3Gen, and to the audio after.

    ``cut_at_markers``: keep the span after the first BOS and before the first EOS (the
    reference's ``drop_invalid_tokens``, original and multilingual only). ``filter_invalid``:
    the reference drops ids >= 6561 (original, Turbo, Nano); the multilingual reference does not
    and would crash on them, so Chorus drops them there too, with a warning.
    ``silence_tokens``: S3GEN_SIL tokens appended (Turbo, Nano: 3). ``drop_last_token_audio``:
    cut the waveform to ``max(1, N - 1) * 960`` samples (multilingual).
    """

    bos: int
    eos: int
    num_codes: int
    cut_at_markers: bool
    filter_invalid: bool
    silence_tokens: int
    drop_last_token_audio: bool

    @classmethod
    def for_variant(cls, variant: Variant) -> "TokenRules":
        t3 = variant.t3
        return cls(
            bos=t3.start_speech_token, eos=t3.stop_speech_token, num_codes=t3.num_speech_codes,
            # The Llama-backbone entry classes (original, multilingual) run drop_invalid_tokens;
            # Turbo and Nano only filter.
            cut_at_markers=t3.backbone.kind == "llama",
            filter_invalid=variant.filter_invalid_speech_tokens,
            silence_tokens=variant.append_silence_tokens,
            drop_last_token_audio=variant.drop_last_token_audio,
        )

    @classmethod
    def verbatim(cls, num_codes: int = 6561) -> "TokenRules":
        """Vocode the tokens as given, the audio kept whole: what ``S3Token2Wav.inference`` does
        without an entry class's clean-up (voice conversion: S3 tokenizer output goes straight to
        S3Gen; no markers to cut, no silence tokens, no tail cut). Ids outside the codebook, which
        the tokenizer never makes, are dropped."""
        return cls(bos=-1, eos=-1, num_codes=num_codes, cut_at_markers=False, filter_invalid=True,
                   silence_tokens=0, drop_last_token_audio=False)


def postprocess_speech_tokens(tokens: TokenSeq, variant: Variant | TokenRules) -> list[int]:
    """T3 output -> the tokens S3Gen vocodes, as the variant's reference entry class does it.

    Original: span after the first BOS (6561) up to the first EOS (6562), then ids < 6561.
    Multilingual: the same span; ids >= 6561 left in it are dropped with a warning (the
    reference passes them on and fails). Turbo/Nano: ids < 6561, then three silence tokens.
    Where the reference raises (two BOS in one output) Chorus cuts after the first one.
    """
    rules = variant if isinstance(variant, TokenRules) else TokenRules.for_variant(variant)
    ids = [int(t) for t in (tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    generated = len(ids)
    if rules.cut_at_markers:
        start = ids.index(rules.bos) + 1 if rules.bos in ids else 0
        end = ids.index(rules.eos) if rules.eos in ids else len(ids)
        ids = ids[start:end]
    valid = [t for t in ids if 0 <= t < rules.num_codes]
    if len(valid) != len(ids) and not rules.filter_invalid:
        logger.warning("dropped %d speech token(s) outside 0..%d that S3Gen cannot vocode",
                       len(ids) - len(valid), rules.num_codes - 1)
    elif len(valid) != generated and rules.cut_at_markers:
        # Forced lengths (min/max_new_tokens) then give shorter audio than 25 tokens/s suggests:
        # say why, as the multilingual message above does.
        logger.warning("S3Gen vocodes %d of %d speech tokens: the clean-up keeps only the span between the "
                       "first start (%d) and stop (%d) markers (%d cut) and drops ids outside 0..%d (%d dropped)",
                       len(valid), generated, rules.bos, rules.eos, generated - len(ids), rules.num_codes - 1,
                       len(ids) - len(valid))
    return valid + [SILENCE_TOKEN] * rules.silence_tokens


def output_num_samples(num_tokens: int, prompt_mel_frames: int, prompt_tokens: int,
                       variant: Variant | TokenRules) -> int:
    """Samples of the waveform :meth:`S3Gen.tokens_to_wav` returns for ``num_tokens`` (already
    post-processed) tokens: 960 per token, one mel frame (480) less when the prompt mel has an
    odd length (the reference's quirk), the multilingual tail cut applied."""
    if num_tokens == 0:
        return 0
    rules = variant if isinstance(variant, TokenRules) else TokenRules.for_variant(variant)
    frames = 2 * (prompt_tokens + num_tokens) - prompt_mel_frames
    samples = frames * SAMPLES_PER_TOKEN // 2
    if rules.drop_last_token_audio:
        samples = min(samples, max(1, num_tokens - 1) * SAMPLES_PER_TOKEN)
    return samples


def item_generators(seed: int, device: torch.device | str) -> tuple[torch.Generator, torch.Generator]:
    """(device generator, CPU phase generator) reproducing ``torch.manual_seed(seed)`` for one item.

    The reference draws the flow noise and the vocoder noise on the model's device and the
    vocoder's harmonic phases on the CPU. On the CPU all three share one stream, so both
    generators are the same object.
    """
    device = torch.device(device)
    main = torch.Generator(device=device).manual_seed(seed)
    phases = main if device.type == "cpu" else torch.Generator().manual_seed(seed)
    return main, phases


class S3Gen(nn.Module):
    """Token -> waveform model of one variant (``flow`` + ``mel2wav``), plus optionally the
    reference-clip models (``tokenizer``, ``speaker_encoder``). Build with
    :meth:`from_checkpoint` or :meth:`from_state_dict`."""

    def __init__(self, variant: Variant, flow: FlowDecoder, mel2wav: HiFTGenerator,
                 tokenizer: S3TokenizerV2 | None = None, speaker_encoder: CAMPPlus | None = None):
        super().__init__()
        if flow.config.meanflow != variant.s3gen.meanflow:
            raise ValueError(f"the {variant.name} variant needs a "
                             f"{'meanflow' if variant.s3gen.meanflow else 'standard'} flow")
        self.variant = variant
        self.rules = TokenRules.for_variant(variant)
        self.flow = flow
        self.mel2wav = mel2wav
        self.tokenizer = tokenizer
        self.speaker_encoder = speaker_encoder

    # ---------------------------------------------------------------------------------- loading
    @classmethod
    def expected_keys(cls, config: FlowConfig) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
        """Every key of an official S3Gen file with its shape, and the keys that may be absent."""
        with torch.device("meta"):
            flow = FlowDecoder(config)
        parts = {
            "flow.": {k: tuple(v.shape) for k, v in flow.state_dict().items()},
            "mel2wav.": HiFTGenerator.checkpoint_shapes(),
            "tokenizer.": S3TokenizerV2.checkpoint_shapes(),
            "speaker_encoder.": CAMPPlus.checkpoint_shapes(),
        }
        expected = {prefix + k: shape for prefix, shapes in parts.items() for k, shape in shapes.items()}
        optional = frozenset({"tokenizer._mel_filters", "tokenizer.window"}
                             | {k for k in expected if k.endswith("num_batches_tracked")})
        return expected, optional

    @classmethod
    def from_state_dict(
        cls, variant: Variant, state: Mapping[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu", voice_models: bool = True, source: str = "S3Gen state dict",
        flow_config: FlowConfig | None = None,
    ) -> "S3Gen":
        """Build from a whole official S3Gen state dict, checked strictly (every key of the four
        parts, nothing else; the tokenizer's two constant buffers and BatchNorm counters may be
        absent; HiFT weight norm in either spelling). ``dtype`` applies to the flow and vocoder;
        the tokenizer and CAMPPlus (built only with ``voice_models``) stay float32."""
        from chorus.models.s3gen.hift import canonical_weight_norm_names

        config = flow_config or FlowConfig(meanflow=variant.s3gen.meanflow, cfg_rate=variant.s3gen.cfg_rate)
        vocoder_state = canonical_weight_norm_names(
            {k[len("mel2wav."):]: v for k, v in state.items() if k.startswith("mel2wav.")})
        renamed = {k: v for k, v in state.items() if not k.startswith("mel2wav.")}
        renamed.update({"mel2wav." + k: v for k, v in vocoder_state.items()})
        expected, optional = cls.expected_keys(config)
        report = compare_state_dict(renamed, expected, source, optional)
        if not report.ok:
            raise CheckpointMismatchError(_mode_hint(report, variant))
        flow = FlowDecoder.from_state_dict(config, state, dtype=dtype, device=device, prefix="flow.", source=source)
        mel2wav = HiFTGenerator.from_state_dict(vocoder_state, dtype=dtype, device=device, source=source)
        tokenizer = speaker_encoder = None
        if voice_models:
            tokenizer = S3TokenizerV2.from_state_dict(state, prefix="tokenizer.", device=device, source=source)
            speaker_encoder = CAMPPlus.from_state_dict(state, prefix="speaker_encoder.", device=device, source=source)
        return cls(variant, flow, mel2wav, tokenizer, speaker_encoder).eval()

    @classmethod
    def from_checkpoint(cls, checkpoint, dtype: str | torch.dtype = "fp32", device: str | torch.device | None = "cpu",
                        *, voice_models: bool = True) -> "S3Gen":
        """Load the S3Gen file of a :class:`chorus.models.loading.Checkpoint`."""
        from chorus.models.loading import parse_device, parse_dtype

        path = checkpoint.path(checkpoint.variant.files.s3gen)
        return cls.from_state_dict(checkpoint.variant, checkpoint.s3gen_state(), dtype=parse_dtype(dtype),
                                   device=parse_device(device), voice_models=voice_models, source=str(path))

    @property
    def device(self) -> torch.device:
        return self.flow.encoder_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.flow.dtype

    # -------------------------------------------------------------------------------- inference
    def postprocess_tokens(self, tokens: TokenSeq) -> list[int]:
        """The variant's clean-up of raw T3 output (see :func:`postprocess_speech_tokens`)."""
        return postprocess_speech_tokens(tokens, self.rules)

    @torch.inference_mode()
    def tokens_to_wav(
        self, tokens: Sequence[TokenSeq], voices, *, seeds: int | Sequence[int] | None = None,
        generators: Sequence[tuple[torch.Generator, torch.Generator]] | None = None,
        n_steps: int | None = None, cfg_rate: float | None = None, postprocess: bool = True,
        rules: TokenRules | None = None,
    ) -> list[torch.Tensor]:
        """Vocode a batch: one waveform (1-D float32, CPU, 24 kHz) per item.

        Args:
            tokens: per item, raw T3 speech tokens (``postprocess=True``: the variant's clean-up
              runs first) or the exact tokens to vocode (``postprocess=False``).
            voices: one :class:`chorus.voices.Voice` (or :class:`chorus.voices.S3GenPrompt`) for
              every item, or one per item.
            seeds: one seed per item (an int is used for every item); None draws random seeds.
            generators: instead of seeds, per item a (device generator, CPU phase generator)
              pair, e.g. from :func:`item_generators`; they advance as the item's noise is drawn.
            n_steps: flow solver steps (default: the variant's, 10 or meanflow's 2).
            cfg_rate: flow CFG weight (standard flow only; default the variant's 0.7).
            rules: the token clean-up and audio rules (default: the variant's, for T3 output;
              ``TokenRules.verbatim()`` for voice conversion).

        An item left with no tokens gives an empty waveform. Every item gets the samples it
        would get alone (the batch is padded and masked, randomness is per item).
        """
        count = len(tokens)
        rules = rules or self.rules
        items = [postprocess_speech_tokens(t, rules) if postprocess else
                 [int(x) for x in (t.reshape(-1).tolist() if isinstance(t, torch.Tensor) else t)] for t in tokens]
        voice_list = list(voices) if isinstance(voices, (list, tuple)) else [voices] * count
        if len(voice_list) != count:
            raise ValueError(f"got {len(voice_list)} voices for {count} items")
        if generators is not None:
            if seeds is not None:
                raise ValueError("pass seeds or generators, not both")
            pairs = list(generators)
        else:
            if seeds is None:
                seed_list = [secrets.randbits(63) for _ in range(count)]
            elif isinstance(seeds, int):
                seed_list = [seeds] * count
            else:
                seed_list = [int(s) for s in seeds]
            pairs = [item_generators(seed, self.device) for seed in seed_list]
        if len(pairs) != count:
            raise ValueError(f"got {len(pairs)} seeds or generator pairs for {count} items")
        out = [torch.zeros(0)] * count
        active = [i for i in range(count) if items[i]]
        if not active:
            return out
        wavs = self._vocode_batch([items[i] for i in active], [voice_list[i] for i in active],
                                  [pairs[i] for i in active], n_steps, cfg_rate, rules)
        for i, wav in zip(active, wavs):
            out[i] = wav
        return out

    def _vocode_batch(self, items: list[list[int]], voices: list,
                      generators: list[tuple[torch.Generator, torch.Generator]],
                      n_steps: int | None, cfg_rate: float | None, rules: TokenRules) -> list[torch.Tensor]:
        device = self.device
        token_lengths = torch.tensor([len(t) for t in items], device=device)
        batch = torch.zeros(len(items), int(token_lengths.max()), dtype=torch.long, device=device)
        for i, t in enumerate(items):
            batch[i, :len(t)] = torch.tensor(t, dtype=torch.long, device=device)
        prompt = _stack_prompts(voices, device)
        mel, mel_lengths = self.flow.inference(
            batch, token_lengths, *prompt, noise=[g for g, _ in generators],
            n_steps=self.variant.s3gen.flow_steps if n_steps is None else n_steps, cfg_rate=cfg_rate,
        )
        noise = draw_source_noise(mel_lengths.tolist(), self.mel2wav.config, device,
                                  noise_generators=[g for g, _ in generators],
                                  phase_generators=[p for _, p in generators])
        vocoded = self.mel2wav(mel, mel_lengths, noise)
        wav = apply_trim_fade(vocoded.wav.float())
        out = []
        for i, length in enumerate(vocoded.wav_lengths.tolist()):
            if rules.drop_last_token_audio:
                length = min(length, max(1, len(items[i]) - 1) * SAMPLES_PER_TOKEN)
            out.append(wav[i, :length].cpu())
        return out


def _stack_prompts(voices: list, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(prompt tokens, their lengths, prompt mel, its lengths, x-vectors), right-padded; batch 1
    when every item has the same voice (the flow broadcasts it)."""
    from chorus.voices import Voice

    unique = voices[:1] if all(v is voices[0] for v in voices) else voices
    unique = [v.s3gen_prompt if isinstance(v, Voice) else v for v in unique]  # S3GenPrompts
    token_lengths = torch.tensor([v.tokens.shape[1] for v in unique], device=device)
    mel_lengths = torch.tensor([v.mel.shape[1] for v in unique], device=device)
    tokens = torch.zeros(len(unique), int(token_lengths.max()), dtype=torch.long, device=device)
    mel = torch.zeros(len(unique), int(mel_lengths.max()), 80, device=device)
    for i, v in enumerate(unique):
        tokens[i, :v.tokens.shape[1]] = v.tokens[0].to(device)
        mel[i, :v.mel.shape[1]] = v.mel[0].to(device=device, dtype=torch.float32)
    xvector = torch.cat([v.xvector.to(device=device, dtype=torch.float32) for v in unique])
    return tokens, token_lengths, mel, mel_lengths, xvector


def _mode_hint(report: KeyReport, variant: Variant) -> KeyReport:
    """Point at the usual cause when only the meanflow mixer differs: the wrong S3Gen file."""
    mixer = "flow.decoder.estimator.time_embed_mixer.weight"
    if mixer in report.missing or mixer in report.unexpected:
        wanted = "s3gen_meanflow.safetensors (Turbo/Nano)" if variant.s3gen.meanflow else \
            "s3gen.safetensors / s3gen.pt (original, multilingual)"
        report.source += f" (the {variant.name} variant needs {wanted})"
    return report
