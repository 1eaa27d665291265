"""S3 speech tokenizer v2 (25 Hz, FSQ codebook of 3^8 = 6561): 16 kHz audio -> speech tokens.

Produces T3's speech prompt and S3Gen's prompt tokens. Front end: 128-bin log10 mel (n_fft 400,
hop 160, the last STFT frame dropped), floored 8 decades below the utterance maximum and mapped
by (x + 4) / 4. Encoder: two stride-2 GELU convolutions (100 Hz -> 25 Hz), six pre-norm
transformer blocks whose attention uses rotary positions and adds an FSMN memory (a depthwise
convolution over the values), then FSQ: Linear(1280 -> 8), tanh, round to {-1, 0, 1}, base-3 id.

Keys are the official ``tokenizer.*`` entries of ``s3gen.safetensors`` (without the prefix).
Clips longer than 30 s are tokenized in 30 s windows with 4 s overlap, as the reference does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from chorus.models.checkpoint import check_state_dict, meta_shapes, strip_prefix
from chorus.models.s3gen.mel import mel_filterbank

# Buffers of the official module that real files may lack; they are recomputed when absent.
OPTIONAL_BUFFERS = frozenset({"_mel_filters", "window"})


@dataclass(frozen=True)
class S3TokenizerConfig:
    sample_rate: int = 16000
    n_fft: int = 400
    hop: int = 160
    n_mels: int = 128
    width: int = 1280
    heads: int = 20
    layers: int = 6
    fsmn_kernel: int = 31
    rotary_positions: int = 2048
    rotary_theta: float = 10000.0
    # eps of the attention-input LayerNorm: 1e-5 in s3tokenizer 0.3.0, 1e-6 in <= 0.2.0 (the
    # reference does not pin the package; the oracle environment pins 0.3.0).
    attn_ln_eps: float = 1e-5
    mlp_ln_eps: float = 1e-5
    fsq_levels: int = 3
    fsq_dims: int = 8
    fsq_scale: float = 0.9990000128746033
    # Long-audio windowing (frames at 100 Hz) and how many tokens each internal boundary drops.
    window_frames: int = 3000
    window_stride_frames: int = 2600
    boundary_tokens: int = 50

    @property
    def codebook_size(self) -> int:
        return self.fsq_levels ** self.fsq_dims

    @property
    def frames_per_token(self) -> int:
        return 4


def _conv_out_len(lengths: torch.Tensor) -> torch.Tensor:
    """Length after a kernel-3, stride-2, padding-1 convolution."""
    return (lengths - 1) // 2 + 1


def _valid_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


class _FP32LayerNorm(nn.LayerNorm):
    """LayerNorm evaluated in float32 whatever the activation dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(),
                            self.eps).to(x.dtype)


class _FSMNAttention(nn.Module):
    def __init__(self, cfg: S3TokenizerConfig):
        super().__init__()
        self.heads = cfg.heads
        self.query = nn.Linear(cfg.width, cfg.width)
        self.key = nn.Linear(cfg.width, cfg.width, bias=False)
        self.value = nn.Linear(cfg.width, cfg.width)
        self.out = nn.Linear(cfg.width, cfg.width)
        self.fsmn_block = nn.Conv1d(cfg.width, cfg.width, cfg.fsmn_kernel, groups=cfg.width, bias=False)
        self.fsmn_pad = ((cfg.fsmn_kernel - 1) // 2, cfg.fsmn_kernel - 1 - (cfg.fsmn_kernel - 1) // 2)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor, valid: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, steps, width = x.shape
        head_dim = width // self.heads
        q = _rotate(self.query(x).view(batch, steps, self.heads, head_dim), cos, sin)
        k = _rotate(self.key(x).view(batch, steps, self.heads, head_dim), cos, sin)
        v = self.value(x)

        # FSMN memory: a depthwise convolution over the (masked) values, plus the values.
        v_masked = v * valid
        memory = self.fsmn_block(F.pad(v_masked.transpose(1, 2), self.fsmn_pad)).transpose(1, 2)
        memory = (memory + v_masked) * valid

        # q and k are each scaled by head_dim^-1/4 (the reference's order of operations).
        scale = head_dim ** -0.25
        q = q.permute(0, 2, 1, 3) * scale
        k = k.permute(0, 2, 3, 1) * scale
        scores = (q @ k + key_bias).float()
        weights = torch.softmax(scores, dim=-1).to(q.dtype)
        attended = (weights @ v.view(batch, steps, self.heads, head_dim).permute(0, 2, 1, 3))
        return self.out(attended.permute(0, 2, 1, 3).reshape(batch, steps, width)) + memory


def _rotary_tables(cfg: S3TokenizerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (positions, head_dim) of the rotary angles, each half repeated twice."""
    head_dim = cfg.width // cfg.heads
    inv_freq = 1.0 / (cfg.rotary_theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(cfg.rotary_positions, dtype=torch.float32), inv_freq)
    return torch.cos(angles).repeat(1, 2), torch.sin(angles).repeat(1, 2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, "rotate-half" pairing of dims i and i + D/2; x is (B, T, H, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _Block(nn.Module):
    def __init__(self, cfg: S3TokenizerConfig):
        super().__init__()
        self.attn = _FSMNAttention(cfg)
        self.attn_ln = _FP32LayerNorm(cfg.width, eps=cfg.attn_ln_eps)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width))
        self.mlp_ln = _FP32LayerNorm(cfg.width, eps=cfg.mlp_ln_eps)

    def forward(self, x, key_bias, valid, cos, sin):
        x = x + self.attn(self.attn_ln(x), key_bias, valid, cos, sin)
        return x + self.mlp(self.mlp_ln(x))


class _Encoder(nn.Module):
    def __init__(self, cfg: S3TokenizerConfig):
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.n_mels, cfg.width, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(cfg.width, cfg.width, kernel_size=3, stride=2, padding=1)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        cos, sin = _rotary_tables(cfg)
        # Not in the state dict (the reference keeps the table as a plain attribute).
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def forward(self, mel: torch.Tensor, mel_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = mel * _valid_mask(mel_lens, mel.shape[-1])[:, None].to(mel.dtype)
        x = F.gelu(self.conv1(x))
        lens = _conv_out_len(mel_lens)
        x = x * _valid_mask(lens, x.shape[-1])[:, None].to(x.dtype)
        x = F.gelu(self.conv2(x))
        lens = _conv_out_len(lens)
        valid = _valid_mask(lens, x.shape[-1])
        x = x.transpose(1, 2)  # (B, T, width)
        steps = x.shape[1]
        if steps > self.rotary_cos.shape[0]:
            raise ValueError(f"{steps} tokens exceed the encoder's {self.rotary_cos.shape[0]} rotary positions")
        cos = self.rotary_cos[:steps, None, :].to(x.dtype)
        sin = self.rotary_sin[:steps, None, :].to(x.dtype)
        key_bias = ((~valid).to(x.dtype) * -1.0e10)[:, None, None, :]
        valid_f = valid[..., None].to(x.dtype)
        for block in self.blocks:
            x = block(x, key_bias, valid_f, cos, sin)
        return x, lens


# These two one-attribute modules exist only so the projection's key is the official
# ``quantizer._codebook.project_down.*``.
class _FSQCodebook(nn.Module):
    def __init__(self, cfg: S3TokenizerConfig):
        super().__init__()
        self.project_down = nn.Linear(cfg.width, cfg.fsq_dims)


class _FSQ(nn.Module):
    def __init__(self, cfg: S3TokenizerConfig):
        super().__init__()
        self._codebook = _FSQCodebook(cfg)


class S3TokenizerV2(nn.Module):
    """The speech tokenizer. Use :meth:`tokenize` on 16 kHz waveforms."""

    def __init__(self, config: S3TokenizerConfig = S3TokenizerConfig()):
        super().__init__()
        self.config = config
        constants = self._constant_buffers(config)
        self.register_buffer("_mel_filters", constants["_mel_filters"])
        self.register_buffer("window", constants["window"])
        self.encoder = _Encoder(config)
        self.quantizer = _FSQ(config)
        self.register_buffer("fsq_powers", constants["fsq_powers"], persistent=False)

    @classmethod
    def checkpoint_shapes(cls, config: S3TokenizerConfig = S3TokenizerConfig()) -> dict[str, tuple[int, ...]]:
        return meta_shapes(lambda: cls(config))

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, torch.Tensor], *, config: S3TokenizerConfig = S3TokenizerConfig(),
        prefix: str = "", device: torch.device | str = "cpu", source: str = "S3Tokenizer state dict",
    ) -> "S3TokenizerV2":
        """Build an eval-mode fp32 tokenizer from official weights.

        ``state`` may be a whole ``s3gen`` state dict with ``prefix="tokenizer."``; keys outside
        the prefix are ignored. ``_mel_filters`` and ``window`` may be absent (recomputed).
        """
        own = strip_prefix(state, prefix)
        check_state_dict(own, cls.checkpoint_shapes(config), source + (f" [{prefix}*]" if prefix else ""),
                         optional=OPTIONAL_BUFFERS)
        constants = cls._constant_buffers(config)
        weights = {k: v.to(device=device, dtype=torch.float32) for k, v in own.items()}
        for name in OPTIONAL_BUFFERS:
            weights.setdefault(name, constants[name].to(device))
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(weights, strict=True, assign=True)
        model.encoder.rotary_cos = constants["encoder.rotary_cos"].to(device)
        model.encoder.rotary_sin = constants["encoder.rotary_sin"].to(device)
        model.fsq_powers = constants["fsq_powers"].to(device)
        return model.eval().requires_grad_(False)

    @staticmethod
    def _constant_buffers(config: S3TokenizerConfig) -> dict[str, torch.Tensor]:
        """Buffers that are functions of the config, not learned."""
        cos, sin = _rotary_tables(config)
        return {
            "_mel_filters": mel_filterbank(config.sample_rate, config.n_fft, config.n_mels),
            "window": torch.hann_window(config.n_fft),
            "encoder.rotary_cos": cos,
            "encoder.rotary_sin": sin,
            "fsq_powers": config.fsq_levels ** torch.arange(config.fsq_dims, dtype=torch.float32),
        }

    @property
    def device(self) -> torch.device:
        return self.window.device

    # ---- front end ------------------------------------------------------------------------

    def log_mel(self, wav: torch.Tensor) -> torch.Tensor:
        """(128, floor(L / 160)) log-mel of one 16 kHz waveform (L,), normalised per utterance."""
        cfg = self.config
        wav = wav.to(device=self.device, dtype=torch.float32)
        if wav.dim() != 1:
            raise ValueError(f"log_mel expects a 1-D waveform, got shape {tuple(wav.shape)}")
        if wav.shape[0] <= cfg.n_fft // 2:
            raise ValueError(f"the tokenizer needs more than {cfg.n_fft // 2} samples, got {wav.shape[0]}")
        spec = torch.stft(wav, cfg.n_fft, cfg.hop, window=self.window, center=True, pad_mode="reflect",
                          return_complex=True)
        power = spec[..., :-1].abs() ** 2
        log_mel = torch.clamp(self._mel_filters @ power, min=1e-10).log10()
        log_mel = torch.maximum(log_mel, log_mel.max() - 8.0)
        return (log_mel + 4.0) / 4.0

    # ---- encoder + FSQ --------------------------------------------------------------------

    def fsq_values(self, mel: torch.Tensor, mel_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-rounding FSQ values (B, T', 8) in (-1, 1) and token lengths, for mels of <= 30 s."""
        hidden, lens = self.encoder(mel, mel_lens)
        values = self.quantizer._codebook.project_down(hidden).float().tanh() * self.config.fsq_scale
        return values, lens

    def tokens_from_fsq_values(self, values: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Round FSQ values to {-1, 0, 1} (half to even) and read the digits + 1 in base 3."""
        digits = values.round() + 1
        tokens = (digits * self.fsq_powers).sum(-1).long()
        return tokens.masked_fill(~_valid_mask(lens, tokens.shape[1]), 0)

    def _encode(self, mel: torch.Tensor, mel_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, lens = self.fsq_values(mel, mel_lens)
        return self.tokens_from_fsq_values(values, lens), lens

    @torch.inference_mode()
    def forward(self, mel: torch.Tensor, mel_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (B, T') int64, zero past each length, and lengths (B,) for padded mels (B, 128, T)."""
        cfg = self.config
        mel_lens = mel_lens.to(device=mel.device, dtype=torch.long)
        if int(mel_lens.max()) <= cfg.window_frames:
            return self._encode(mel[..., : int(mel_lens.max())], mel_lens)
        return self._encode_windowed(mel, mel_lens)

    def _encode_windowed(self, mel: torch.Tensor, mel_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clips over 30 s: encode 30 s windows (4 s overlap) in one batch, then stitch."""
        cfg = self.config
        segments, segment_lens, owners = [], [], []
        for item, length in enumerate(mel_lens.tolist()):
            starts = [0] if length <= cfg.window_frames else range(0, length, cfg.window_stride_frames)
            for start in starts:
                seg = mel[item, :, start: min(start + cfg.window_frames, length)]
                segment_lens.append(seg.shape[-1])
                segments.append(F.pad(seg, (0, cfg.window_frames - seg.shape[-1])))
                owners.append((item, length > cfg.window_frames))
        codes, code_lens = self._encode(torch.stack(segments), torch.tensor(segment_lens, device=mel.device))
        pieces: list[list[torch.Tensor]] = [[] for _ in range(mel.shape[0])]
        for (item, _), seg_codes, n in zip(owners, codes, code_lens.tolist()):
            pieces[item].append(seg_codes[:n])
        merged = []
        for item, parts in enumerate(pieces):
            drop = cfg.boundary_tokens
            if len(parts) > 1:
                parts = [p[(drop if i > 0 else 0): (len(p) - drop if i < len(parts) - 1 else len(p))]
                         for i, p in enumerate(parts)]
            merged.append(torch.cat(parts))
        lens = torch.tensor([len(m) for m in merged], device=mel.device)
        tokens = torch.zeros(len(merged), int(lens.max()), dtype=torch.long, device=mel.device)
        for item, m in enumerate(merged):
            tokens[item, : len(m)] = m
        return tokens, lens

    @torch.inference_mode()
    def tokenize(
        self, wavs: Sequence[np.ndarray | torch.Tensor] | np.ndarray | torch.Tensor, *, max_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Speech tokens of 16 kHz waveforms: (tokens (B, T') int64, lengths (B,)).

        ``wavs`` is one waveform (L,) or a sequence of them (any lengths; batched with padding,
        each item gets the tokens it would get alone). ``max_len`` keeps only the first
        ``max_len`` tokens' worth of mel frames (the reference's T3 prompt cap); the mel floor is
        still taken over the whole waveform, so cut the clip to the prompt length first (see
        :attr:`chorus.audio.ReferenceAudio.t3_prompt_16k`) to reproduce the reference.
        """
        if isinstance(wavs, (np.ndarray, torch.Tensor)) and wavs.ndim == 1:
            wavs = [wavs]
        if len(wavs) == 0:
            raise ValueError("tokenize needs at least one waveform")
        mels = []
        for wav in wavs:
            mel = self.log_mel(torch.as_tensor(wav))
            if max_len is not None:
                mel = mel[:, : max_len * self.config.frames_per_token]
            mels.append(mel)
        lens = torch.tensor([m.shape[-1] for m in mels], device=self.device)
        batch = torch.zeros(len(mels), self.config.n_mels, int(lens.max()), device=self.device)
        for i, mel in enumerate(mels):
            batch[i, :, : mel.shape[-1]] = mel
        return self(batch, lens)
