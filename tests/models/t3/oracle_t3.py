"""Reference T3 as a test oracle: build it for a Chorus ``T3Config`` (full size or tiny), save it
in the official layout, and record its per-step logits through its own inference loops.

Sampling is pinned by replacing ``torch.multinomial`` with a scripted token sequence; a forward
hook on ``speech_head`` records the last-position logits of every forward (prefill first,
then one per fed-back token), and a hook on ``cond_enc`` records the conditioning. This runs
the reference's own input assembly, BOS handling and cache logic unchanged.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from unittest import mock

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from chorus.models.t3 import T3Model, T3SingleSequence
from chorus.models.variants import GPT2_MEDIUM, LLAMA_520M, T3Config

TOLERANCE = 1e-4


def _oracle_backbone_name(config: T3Config) -> str:
    """Name of the reference's LLAMA_CONFIGS entry for this backbone, registering it if new."""
    from chatterbox.models.t3.llama_configs import GPT2_MEDIUM_CONFIG, LLAMA_520M_CONFIG_DICT, LLAMA_CONFIGS

    bb = config.backbone
    if bb == LLAMA_520M:
        return "Llama_520M"
    if bb == GPT2_MEDIUM:
        return "GPT2_medium"
    name = f"chorus_{bb.kind}_{bb.num_layers}x{bb.hidden_size}x{bb.num_heads}"
    if bb.kind == "llama":
        entry = dict(
            LLAMA_520M_CONFIG_DICT, hidden_size=bb.hidden_size, intermediate_size=bb.intermediate_size,
            num_hidden_layers=bb.num_layers, num_attention_heads=bb.num_heads,
            num_key_value_heads=bb.num_kv_heads, head_dim=bb.head_dim,
        )
    else:
        # GPT2_small (Nano) is not in 0.1.7: same fields as GPT2_medium, smaller stack
        assert bb.intermediate_size == 4 * bb.hidden_size
        entry = dict(
            GPT2_MEDIUM_CONFIG, n_embd=bb.hidden_size, hidden_size=bb.hidden_size, n_head=bb.num_heads,
            n_layer=bb.num_layers,
        )
    LLAMA_CONFIGS.setdefault(name, entry)
    return name


def _oracle_hparams(config: T3Config):
    from chatterbox.models.t3.modules.t3_config import T3Config as RefT3Config

    bb = config.backbone
    # The 0.1.7 multilingual path hooks layers 9-13, heads up to 15: only a full-size stack has them
    keep_analyzer = bb.num_layers >= 14 and bb.num_heads >= 16

    class Hparams(RefT3Config):
        @property
        def is_multilingual(self):
            return super().is_multilingual and keep_analyzer

    hp = Hparams(text_tokens_dict_size=config.text_vocab_size)
    hp.llama_config_name = _oracle_backbone_name(config)
    hp.speech_tokens_dict_size = config.speech_vocab_size
    if bb.kind == "gpt2":
        hp.input_pos_emb = None
        hp.speech_cond_prompt_len = config.speech_cond_prompt_len
        hp.use_perceiver_resampler = False
        hp.emotion_adv = False
    return hp


def fill_random_weights(module: torch.nn.Module, seed: int) -> None:
    """Give every parameter a seeded random value that makes it matter.

    Matrices are unit-gain (std 1/sqrt(fan_in)) and embedding tables unit-scale: the usual
    std-0.02 init leaves tiny stacks almost blind to the text and the emotion value. Norm
    scales sit near 1 and biases near 0 but never exactly, so a swapped scale/bias or a skipped
    bias changes the output. The perceiver's query keeps its own init.
    """
    generator = torch.Generator().manual_seed(seed)
    filled = set()

    def fill(param, mean: float, std: float) -> None:
        param.normal_(mean, std, generator=generator)
        filled.add(id(param))

    with torch.no_grad():
        for sub in module.modules():
            kind = type(sub).__name__
            if isinstance(sub, torch.nn.Linear):
                fill(sub.weight, 0.0, sub.in_features ** -0.5)
            elif kind == "Conv1D":  # transformers' GPT-2 layout [in, out]
                fill(sub.weight, 0.0, sub.weight.shape[0] ** -0.5)
            elif isinstance(sub, torch.nn.Embedding):
                fill(sub.weight, 0.0, 1.0)
            elif isinstance(sub, torch.nn.LayerNorm) or kind.endswith("RMSNorm"):
                fill(sub.weight, 1.0, 0.1)
            else:
                continue
            if getattr(sub, "bias", None) is not None:
                fill(sub.bias, 0.0, 0.05)
        left = [n for n, p in module.named_parameters() if id(p) not in filled]
        assert left == ["cond_enc.perceiver.pre_attention_query"] or not left, left


def build_oracle_t3(config: T3Config, seed: int = 0):
    """The reference T3 for ``config`` with seeded random weights (see fill_random_weights), in eval mode."""
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules import cond_enc
    from chatterbox.models.t3.modules.perceiver import Perceiver
    from transformers.initialization import no_init_weights

    hp = _oracle_hparams(config)
    patch = contextlib.nullcontext()
    if config.use_perceiver and config.hidden_size != 1024:
        # the reference hard-wires the perceiver width to 1024
        d = config.hidden_size

        def narrow_perceiver():
            return Perceiver(pre_attention_query_size=d, embedding_dim=d, num_attn_heads=config.perceiver_heads)

        patch = mock.patch.object(cond_enc, "Perceiver", narrow_perceiver)
    torch.manual_seed(seed)
    # the reference's own init would be overwritten anyway; skipping it saves ~20 s at full size
    with patch, no_init_weights():
        t3 = T3(hp)
    fill_random_weights(t3, seed + 1)
    return t3.eval()


def save_official(t3, path: str) -> None:
    """Save the reference module's state dict as an official safetensors file."""
    save_file({k: v.contiguous() for k, v in t3.state_dict().items()}, path)


@dataclass
class Capture:
    cond: torch.Tensor | None = None  # [1, C, D]
    logits: list[torch.Tensor] = field(default_factory=list)  # [rows, V] per forward
    prompt_embeds: torch.Tensor | None = None  # the prompt embedding the reference cached


@contextlib.contextmanager
def _recording(t3, scripted_tokens: list[int]):
    capture = Capture()
    tokens = iter(scripted_tokens)

    def fake_multinomial(probs, num_samples=1, **_):
        return torch.full((probs.shape[0], num_samples), next(tokens), dtype=torch.long, device=probs.device)

    def on_cond(_module, _inputs, output):
        capture.cond = output.detach().clone()

    def on_head(_module, _inputs, output):
        capture.logits.append(output[:, -1, :].detach().clone())

    def quiet(iterable, *_args, **_kwargs):
        return iterable

    handles = [t3.cond_enc.register_forward_hook(on_cond), t3.speech_head.register_forward_hook(on_head)]
    try:
        with mock.patch("torch.multinomial", fake_multinomial), \
                mock.patch("chatterbox.models.t3.t3.tqdm", quiet):
            yield capture
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class Request:
    """One synthesis request's T3 inputs plus the tokens fed back after the prefill."""

    speaker: torch.Tensor  # [1, 256]
    prompt: torch.Tensor | None  # [1, P] speech tokens
    text: torch.Tensor  # [Lt] tokenizer output, unframed
    fed_tokens: tuple[int, ...]


@dataclass(frozen=True)
class Scenario:
    exaggeration: float
    cfg: bool


def make_request(
    config: T3Config, seed: int, *, text_len: int = 12, prompt_len: int | None = None,
    steps: int = 20, with_prompt: bool = True,
) -> Request:
    """Seeded inputs: a unit-norm speaker embedding, prompt tokens (the variant's prompt length
    unless given), text ids and ``steps`` speech codes (never BOS/EOS) to feed back."""
    g = torch.Generator().manual_seed(seed)
    speaker = F.normalize(torch.randn(1, config.speaker_embed_size, generator=g), dim=-1)
    prompt_len = prompt_len or config.speech_cond_prompt_len
    prompt = torch.randint(0, config.num_speech_codes, (1, prompt_len), generator=g)
    if config.start_text_token is None:
        text = torch.randint(0, config.text_vocab_size, (text_len,), generator=g)
    else:
        # ids avoid SOT (255) and EOT (0) so that the framing is the only place they occur
        text = torch.randint(1, 255, (text_len,), generator=g)
    tokens = torch.randint(0, config.num_speech_codes, (steps,), generator=g).tolist()
    return Request(speaker, prompt if with_prompt else None, text, tuple(tokens))


def _oracle_cond(request: Request, exaggeration: float):
    from chatterbox.models.t3.modules.cond_enc import T3Cond

    # fresh tensors each call: the reference caches the prompt embedding on the object
    prompt = None if request.prompt is None else request.prompt.clone()
    return T3Cond(
        speaker_emb=request.speaker.clone(), cond_prompt_speech_tokens=prompt,
        emotion_adv=exaggeration * torch.ones(1, 1, 1),
    )


def oracle_conditioning(t3, request: Request, exaggeration: float) -> torch.Tensor:
    """The reference's conditioning embeddings [1, C, D] alone."""
    with torch.inference_mode():
        return t3.prepare_conditioning(_oracle_cond(request, exaggeration)).clone()


def _run_oracle_llama(t3, config: T3Config, request: Request, scenario: Scenario) -> Capture:
    # as tts.py / mtl_tts.py call it: SOT/EOT framing, text duplicated to the two rows; with
    # cfg_weight 0 the reference leaves both rows conditional (the multilingual path)
    text = request.text[None]
    framed = F.pad(F.pad(text, (1, 0), value=config.start_text_token), (0, 1), value=config.stop_text_token)
    cond = _oracle_cond(request, scenario.exaggeration)
    fed = list(request.fed_tokens)
    with _recording(t3, fed) as capture:
        t3.inference(
            t3_cond=cond, text_tokens=torch.cat([framed, framed]), max_new_tokens=len(fed),
            cfg_weight=0.5 if scenario.cfg else 0.0,
            temperature=0.8, top_p=1.0, min_p=0.05, repetition_penalty=1.2,
        )
    if not scenario.cfg:
        capture.logits = [rows[:1] for rows in capture.logits]
    capture.prompt_embeds = None if cond.cond_prompt_speech_emb is None else cond.cond_prompt_speech_emb.clone()
    return capture


def _run_oracle_turbo(t3, request: Request) -> Capture:
    # as tts_turbo.py calls it; the loop samples once more after the last fed token
    cond = _oracle_cond(request, 0.0)
    fed = list(request.fed_tokens)
    with _recording(t3, [*fed, 0]) as capture:
        t3.inference_turbo(cond, request.text[None], max_gen_len=len(fed))
    capture.prompt_embeds = None if cond.cond_prompt_speech_emb is None else cond.cond_prompt_speech_emb.clone()
    return capture


def run_oracle(t3, config: T3Config, request: Request, scenario: Scenario) -> Capture:
    """The reference's own inference loop on ``request``: conditioning, then logits [rows, V] of
    the prefill and of one forward per fed token (rows = 2 with CFG, row 0 conditional)."""
    if config.backbone.kind == "llama":
        capture = _run_oracle_llama(t3, config, request, scenario)
    else:
        assert not scenario.cfg
        capture = _run_oracle_turbo(t3, request)
    assert len(capture.logits) == len(request.fed_tokens) + 1
    return capture


def run_chorus(model: T3Model, request: Request, scenario: Scenario) -> Capture:
    """The same request through ``T3SingleSequence``."""
    capture = Capture()
    with torch.inference_mode():
        capture.cond = model.encode_conditioning(request.speaker, request.prompt, scenario.exaggeration)
    runner = T3SingleSequence(
        model, capture.cond, request.text, cfg=scenario.cfg, max_new_tokens=len(request.fed_tokens)
    )
    capture.logits.append(runner.prefill())
    for token in request.fed_tokens:
        capture.logits.append(runner.decode(token))
    return capture


def max_abs_error(a: list[torch.Tensor] | torch.Tensor, b: list[torch.Tensor] | torch.Tensor) -> float:
    if isinstance(a, torch.Tensor):
        a, b = [a], [b]
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        assert x.shape == y.shape, (x.shape, y.shape)
        worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst


def cfg_combine(rows: torch.Tensor, weight: float) -> torch.Tensor:
    """cond + w * (cond - uncond) over [2, V] rows (what sampling does; here only for checks)."""
    cond, uncond = rows[0], rows[1]
    return cond + weight * (cond - uncond)


def report(label: str, error: float) -> float:
    """Print a measured error (visible with ``pytest -s``) and return it."""
    print(f"[t3 parity] {label}: max abs err {error:.3g}")
    return error
