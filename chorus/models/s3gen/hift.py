"""HiFT vocoder (neural source filter + iSTFT head): 24 kHz log-mel (B, 80, T) -> waveform (B, 480 T).

Batched with per-item lengths: every item of a padded batch gets the waveform it would get alone.
Padding is zeroed after every convolution (so each conv sees the zeros an unbatched item would),
the source STFT reflects each item at its own end, and the inverse STFT normalises each item by its
own window envelope. All randomness (harmonic phases, additive noise) is an explicit input,
:class:`SourceNoise`, drawn by :func:`draw_source_noise` in the reference's order.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from chorus.models.checkpoint import check_state_dict
from chorus.models.s3gen.f0_predictor import WEIGHT_NORM_MARK, F0Predictor, F0PredictorConfig, checkpoint_conv
from chorus.models.s3gen.fused_ops import snake, snake_conv
from chorus.models.s3gen.mel import lengths_mask, reflect_pad
from chorus.triton_backend import BACKENDS


@dataclass(frozen=True)
class HiFTConfig:
    """Shape and constants of the vocoder; defaults are the shipped S3Gen ``mel2wav``."""

    in_channels: int = 80
    base_channels: int = 512
    num_harmonics: int = 9  # the fundamental plus 8 overtones
    sample_rate: int = 24000
    sine_amplitude: float = 0.1
    voiced_noise_std: float = 0.003
    voiced_threshold_hz: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    istft_n_fft: int = 16
    istft_hop: int = 4
    lrelu_slope: float = 0.1
    post_lrelu_slope: float = 0.01  # the reference's last activation uses leaky_relu's default slope
    max_magnitude: float = 100.0
    audio_limit: float = 0.99
    f0: F0PredictorConfig = field(default_factory=F0PredictorConfig)

    def __post_init__(self):
        assert len(self.upsample_rates) == len(self.upsample_kernel_sizes) == len(self.source_resblock_kernel_sizes)
        assert self.f0.in_channels == self.in_channels

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * self.istft_hop


@dataclass
class SourceNoise:
    """The random draws of the harmonic source for one batch (float32).

    ``phases`` (B, H): initial phase of each harmonic in radians (the reference keeps the
    fundamental's at 0). ``noise`` (B, H, S): standard-normal noise, S >= samples of the longest
    item; item b uses ``noise[b, :, :its samples]``.
    """

    phases: torch.Tensor
    noise: torch.Tensor


def draw_source_noise(
    frame_counts: Sequence[int], config: HiFTConfig = HiFTConfig(), device: torch.device | str = "cpu",
    noise_generators: Sequence[torch.Generator | None] | None = None,
    phase_generators: Sequence[torch.Generator | None] | None = None,
    match_reference_rng: bool = True,
) -> SourceNoise:
    """Draw each item's phases and noise from its own generators, item by item, in the reference's order.

    Phases come from CPU generators (the reference samples them on the CPU even on GPU), noise from
    generators on ``device``; ``None`` means torch's default generator. For one item after
    ``torch.manual_seed(s)`` the draws equal the reference vocoder's. ``match_reference_rng``
    also consumes the one unused draw the reference makes, so later draws line up with it too.
    """
    batch = len(frame_counts)
    noise_generators = noise_generators or [None] * batch
    phase_generators = phase_generators or [None] * batch
    assert len(noise_generators) == len(phase_generators) == batch
    harmonics, max_samples = config.num_harmonics, max(frame_counts) * config.samples_per_frame
    phases = torch.zeros(batch, harmonics)
    noise = torch.zeros(batch, harmonics, max_samples, device=device)
    low, high = torch.tensor(-math.pi), torch.tensor(math.pi)
    for b, frames in enumerate(frame_counts):
        samples = frames * config.samples_per_frame
        uniform = torch.rand(1, harmonics, 1, generator=phase_generators[b])
        phases[b] = (low + uniform * (high - low)).view(-1)
        noise[b, :, :samples] = torch.randn(1, harmonics, samples, generator=noise_generators[b], device=device)
        if match_reference_rng:
            torch.randn(1, samples, 1, generator=noise_generators[b], device=device)
    phases[:, 0] = 0.0
    return SourceNoise(phases=phases.to(device), noise=noise)


class Snake(nn.Module):
    """x + sin(alpha x)^2 / alpha with a learned alpha per channel (linear scale), of ``mask * x``
    when a mask is given; one kernel on CUDA (:mod:`chorus.models.s3gen.fused_ops`)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))
        self.ops_backend = "auto"  # set through HiFTGenerator.ops_backend

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return snake(x, self.alpha, mask, self.ops_backend)


class ResBlock(nn.Module):
    """Three Snake -> dilated conv -> Snake -> conv residual units; each Snake and the conv after
    it are one kernel on CUDA (:func:`chorus.models.s3gen.fused_ops.snake_conv`)."""

    def __init__(self, channels: int, kernel: int, dilations: Sequence[int], weight_norm_layout: bool = True):
        super().__init__()

        def conv(dilation: int) -> nn.Module:
            padding = (kernel * dilation - dilation) // 2
            return checkpoint_conv(nn.Conv1d(channels, channels, kernel, dilation=dilation, padding=padding),
                                   weight_norm_layout)

        self.convs1 = nn.ModuleList(conv(d) for d in dilations)
        self.convs2 = nn.ModuleList(conv(1) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            # x is zero past each item already: the first Snake needs no mask
            h = snake_conv(x, act1.alpha, conv1.weight, conv1.bias, conv1.dilation[0], conv1.padding[0],
                           backend=act1.ops_backend)
            x = snake_conv(h, act2.alpha, conv2.weight, conv2.bias, conv2.dilation[0], conv2.padding[0], mask,
                           residual=x, backend=act2.ops_backend)
        return x


class HarmonicSource(nn.Module):
    """Harmonic-plus-noise excitation from upsampled F0, merged to one channel (checkpoint ``m_source``)."""

    def __init__(self, config: HiFTConfig):
        super().__init__()
        self.config = config
        self.l_linear = nn.Linear(config.num_harmonics, 1)

    def forward(self, f0_samples: torch.Tensor, noise: SourceNoise) -> torch.Tensor:
        """f0_samples (B, L) Hz at the audio rate, float32 -> excitation (B, L) float32."""
        cfg, length = self.config, f0_samples.shape[-1]
        f0 = f0_samples[:, None, :]
        harmonic_numbers = torch.arange(1, cfg.num_harmonics + 1, device=f0.device, dtype=f0.dtype)
        cycles_per_sample = f0 * harmonic_numbers[None, :, None] / cfg.sample_rate
        # The running phase is a float32 cumsum over the whole item, as in the reference; it drifts
        # on long items, but a more exact sum would no longer match the reference's waveform.
        phase = 2 * math.pi * (torch.cumsum(cycles_per_sample, dim=-1) % 1)
        sines = cfg.sine_amplitude * torch.sin(phase + noise.phases[:, :, None].to(f0))
        voiced = (f0 > cfg.voiced_threshold_hz).to(f0.dtype)
        noise_std = voiced * cfg.voiced_noise_std + (1 - voiced) * cfg.sine_amplitude / 3
        draws = noise.noise[:, :, :length].to(f0)
        if draws.shape[-1] < length:  # the batch is padded past its longest item
            draws = F.pad(draws, (0, length - draws.shape[-1]))
        excitation = sines * voiced + noise_std * draws
        weight, bias = self.l_linear.weight.float(), self.l_linear.bias.float()
        return torch.tanh(F.linear(excitation.transpose(1, 2), weight, bias)).squeeze(-1)


@dataclass
class HiFTOutput:
    """Vocoder outputs; everything past an item's length is zero."""

    wav: torch.Tensor  # (B, samples_per_frame * T) float32 in [-audio_limit, audio_limit]
    wav_lengths: torch.Tensor  # (B,) samples per item
    f0: torch.Tensor  # (B, T) Hz
    source: torch.Tensor  # (B, samples_per_frame * T) float32 excitation


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


@functools.lru_cache(maxsize=8)
def _periodic_hann(n: int, device: torch.device) -> torch.Tensor:
    # Computed in float64 and rounded once, which is how the reference's (scipy) window is made.
    # Made on the device: torch.compile traces through the cache, and a host-made window would
    # compile into a host-to-device copy, which no CUDA graph can capture.
    return torch.hann_window(n, periodic=True, dtype=torch.float64, device=device).to(torch.float32)


class HiFTGenerator(nn.Module):
    """The S3Gen vocoder. Build it with :meth:`from_state_dict`; call it on (mel, lengths).

    Built with ``weight_norm_layout=True`` its ``state_dict`` has exactly the checkpoint's
    ``mel2wav.*`` names (prefix removed), weight norm included; :meth:`from_state_dict` builds the
    plain layout and folds the checkpoint's weight norm into it once.
    """

    def __init__(self, config: HiFTConfig = HiFTConfig(), weight_norm_layout: bool = True):
        super().__init__()
        self.config = cfg = config
        stft_channels = cfg.istft_n_fft + 2
        channels = [cfg.base_channels // 2 ** (i + 1) for i in range(len(cfg.upsample_rates))]
        self.m_source = HarmonicSource(cfg)
        self.conv_pre = checkpoint_conv(nn.Conv1d(cfg.in_channels, cfg.base_channels, 7, padding=3), weight_norm_layout)
        self.ups = nn.ModuleList(
            checkpoint_conv(nn.ConvTranspose1d(cfg.base_channels // 2 ** i, ch, k, u, padding=(k - u) // 2),
                            weight_norm_layout)
            for i, (u, k, ch) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, channels)))
        self.source_downs = nn.ModuleList()
        for i, ch in enumerate(channels):
            factor = math.prod(cfg.upsample_rates[i + 1:])  # source frames per stage-i step
            self.source_downs.append(
                nn.Conv1d(stft_channels, ch, 2 * factor, factor, padding=factor // 2) if factor > 1
                else nn.Conv1d(stft_channels, ch, 1))
        self.source_resblocks = nn.ModuleList(
            ResBlock(ch, k, d, weight_norm_layout)
            for ch, k, d in zip(channels, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilations))
        self.resblocks = nn.ModuleList(
            ResBlock(ch, k, d, weight_norm_layout)
            for ch in channels for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilations))
        self.conv_post = checkpoint_conv(nn.Conv1d(channels[-1], stft_channels, 7, padding=3), weight_norm_layout)
        self.f0_predictor = F0Predictor(cfg.f0, weight_norm_layout)

    @property
    def ops_backend(self) -> str:
        """The Snake activations' kernels: ``"auto"`` (one Triton kernel each on CUDA, the plain
        tensor ops elsewhere), ``"triton"`` or ``"torch"`` (:mod:`chorus.models.s3gen.fused_ops`)."""
        return self.resblocks[0].activations1[0].ops_backend

    @ops_backend.setter
    def ops_backend(self, backend: str) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"HiFT ops backend must be one of {BACKENDS}, got {backend!r}")
        for module in self.modules():
            if isinstance(module, Snake):
                module.ops_backend = backend

    # ----------------------------------------------------------------------------------- loading
    @classmethod
    def checkpoint_shapes(cls, config: HiFTConfig = HiFTConfig()) -> dict[str, tuple[int, ...]]:
        """Checkpoint key -> shape, weight-norm spelling ``parametrizations.weight.original0/1``."""
        with torch.device("meta"):
            model = cls(config, weight_norm_layout=False)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        for name in _weight_normed_module_names(model):
            shape = shapes.pop(f"{name}.weight")
            shapes[f"{name}.{_GAIN}"] = (shape[0],) + (1,) * (len(shape) - 1)
            shapes[f"{name}.{_DIRECTION}"] = shape
        return shapes

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu", config: HiFTConfig = HiFTConfig(), source: str = "mel2wav",
    ) -> "HiFTGenerator":
        """Load the ``mel2wav.*`` part of an S3Gen checkpoint (keys without the prefix).

        Accepts both weight-norm spellings (``parametrizations.weight.original0/1`` and legacy
        ``weight_g``/``weight_v``); raises :class:`CheckpointMismatchError` on any missing,
        unexpected or wrongly shaped key. Weight norm is folded once, in float32, before casting.
        """
        state = canonical_weight_norm_names(state)
        check_state_dict(state, cls.checkpoint_shapes(config), source)
        with torch.device("meta"):
            model = cls(config, weight_norm_layout=False)
        plain = {k: v.to(torch.float32) for k, v in state.items() if not k.endswith((_GAIN, _DIRECTION))}
        for name in _weight_normed_module_names(model):
            # torch's own weight-norm kernel, so the folded weight is bitwise what the
            # parametrisation would compute on every forward
            plain[f"{name}.weight"] = torch._weight_norm(
                state[f"{name}.{_DIRECTION}"].to(torch.float32), state[f"{name}.{_GAIN}"].to(torch.float32), 0)
        model.load_state_dict(plain, assign=True)
        model.to(device=device, dtype=dtype)
        # The pitch path stays float32 whatever ``dtype``: F0 sets the phase of a sine integrated
        # over the whole item, so bf16 rounding of F0 would shift the harmonics audibly.
        model.f0_predictor.float()
        model.m_source.float()
        return model.eval()

    # ----------------------------------------------------------------------------------- inference
    def stage_lengths(self, frame_counts: torch.Tensor) -> list[torch.Tensor]:
        """Per-item lengths after each upsampling stage (the last includes the 1-step left pad)."""
        lengths, out = frame_counts, []
        for rate in self.config.upsample_rates:
            lengths = lengths * rate
            out.append(lengths)
        out[-1] = out[-1] + 1
        return out

    def predict_f0(self, mel: torch.Tensor, frame_counts: torch.Tensor | None = None) -> torch.Tensor:
        """mel (B, 80, T) -> F0 (B, T) in Hz, zero past each item's frame count (in the predictor's dtype)."""
        mel = mel.to(self.f0_predictor.classifier.weight.dtype)
        return self.f0_predictor(mel, lengths_mask(frame_counts, mel.shape[-1], mel.dtype))

    def harmonic_source(self, f0: torch.Tensor, frame_counts: torch.Tensor | None, noise: SourceNoise) -> torch.Tensor:
        """F0 (B, T) -> excitation (B, samples_per_frame * T) float32, zero past each item's samples."""
        # each frame's F0 held for its samples (repeat_interleave, spelled so it never syncs)
        f0_samples = f0.float()[:, :, None].expand(-1, -1, self.config.samples_per_frame).flatten(1)
        source = self.m_source(f0_samples, noise)
        if frame_counts is None:
            return source
        return _masked(source[:, None], lengths_mask(frame_counts * self.config.samples_per_frame,
                                                     source.shape[-1], source.dtype))[:, 0]

    def decode(self, mel: torch.Tensor, source: torch.Tensor, frame_counts: torch.Tensor | None = None) -> torch.Tensor:
        """mel (B, 80, T) and excitation (B, samples) -> waveform (B, samples) float32.

        ``frame_counts`` None: every item is all T frames (nothing is masked). With counts, every
        step is masked per item and nothing synchronises with the host, so the call can be
        captured in a CUDA graph.
        """
        cfg = self.config
        num_frames = mel.shape[-1]
        num_samples = None if frame_counts is None else frame_counts * cfg.samples_per_frame
        mel = mel.to(self.conv_pre.weight.dtype)
        spectrum = self._source_spectrum(source, num_samples).to(mel.dtype)

        kernels = len(cfg.resblock_kernel_sizes)
        mask = lengths_mask(frame_counts, num_frames, mel.dtype)
        stage_lengths = [None] * len(self.ups) if frame_counts is None else self.stage_lengths(frame_counts)
        x = _masked(self.conv_pre(_masked(mel, mask)), mask)
        for i, (up, stage_len) in enumerate(zip(self.ups, stage_lengths)):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            mask = lengths_mask(stage_len, x.shape[-1], x.dtype)
            x = _masked(x, mask)
            branch = _masked(self.source_downs[i](spectrum), mask)
            x = x + self.source_resblocks[i](branch, mask)
            total = None
            for block in self.resblocks[i * kernels:(i + 1) * kernels]:
                total = block(x, mask) if total is None else total + block(x, mask)
            x = total / kernels
        x = self.conv_post(F.leaky_relu(x, cfg.post_lrelu_slope))
        stft_frames = None if num_samples is None else num_samples // cfg.istft_hop + 1
        wav = self._inverse_stft(x.float(), stft_frames)
        wav = torch.clamp(wav, -cfg.audio_limit, cfg.audio_limit)
        return _masked(wav[:, None], lengths_mask(num_samples, wav.shape[-1], wav.dtype))[:, 0]

    @torch.inference_mode()
    def forward(self, mel: torch.Tensor, frame_counts: torch.Tensor | None = None,
                noise: SourceNoise | None = None) -> HiFTOutput:
        """Vocode a padded batch of log-mels (B, 80, T) with per-item frame counts (B,) (default: all T).

        ``noise`` defaults to :func:`draw_source_noise` on torch's default generators, which for
        batch 1 reproduces the reference's random stream after the same ``torch.manual_seed``.
        """
        if mel.dim() != 3 or mel.shape[1] != self.config.in_channels:
            raise ValueError(f"expected a mel of shape (B, {self.config.in_channels}, T), got {tuple(mel.shape)}")
        if frame_counts is not None:
            frame_counts = frame_counts.to(device=mel.device, dtype=torch.long)
            if bool((frame_counts < 1).any()) or bool((frame_counts > mel.shape[-1]).any()):
                raise ValueError(f"frame counts must lie in [1, {mel.shape[-1]}], got {frame_counts.tolist()}")
        counts = frame_counts if frame_counts is not None else torch.full(
            (mel.shape[0],), mel.shape[-1], dtype=torch.long, device=mel.device)
        if frame_counts is not None and bool((frame_counts == mel.shape[-1]).all()):
            frame_counts = None  # no item is padded: nothing to mask
        if noise is None:
            noise = draw_source_noise(counts.tolist(), self.config, mel.device)
        f0 = self.predict_f0(mel, frame_counts)
        source = self.harmonic_source(f0, frame_counts, noise)
        wav = self.decode(mel, source, frame_counts)
        return HiFTOutput(wav=wav, wav_lengths=counts * self.config.samples_per_frame, f0=f0, source=source)

    # ----------------------------------------------------------------------------------- spectra
    def _source_spectrum(self, source: torch.Tensor, num_samples: torch.Tensor | None) -> torch.Tensor:
        """Excitation (B, L) -> [real; imag] STFT (B, n_fft + 2, L / hop + 1), zero past each item's
        frames (``num_samples`` None: every item is all of L)."""
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        padded = reflect_pad(source.float(), num_samples, n_fft // 2, n_fft // 2)
        spec = torch.view_as_real(torch.stft(padded, n_fft, hop, n_fft, window=_periodic_hann(n_fft, source.device),
                                             center=False, return_complex=True))
        spectrum = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        if num_samples is None:
            return spectrum
        return _masked(spectrum, lengths_mask(num_samples // hop + 1, spectrum.shape[-1], spectrum.dtype))

    def _inverse_stft(self, logits: torch.Tensor, num_stft_frames: torch.Tensor | None) -> torch.Tensor:
        """conv_post output (B, n_fft + 2, F) -> waveform (B, hop * (F - 1)); each item uses only its
        frames (``num_stft_frames`` None: all F).

        Same steps as ``torch.istft(center=True)`` (irfft, window, overlap-add, divide by the summed
        squared window), but the window envelope is per item, so padded frames change nothing.
        """
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop
        bins, num_frames = n_fft // 2 + 1, logits.shape[-1]
        magnitude = torch.clip(torch.exp(logits[:, :bins]), max=self.config.max_magnitude)
        phase = torch.sin(logits[:, bins:])
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        window = _periodic_hann(n_fft, logits.device)
        frame_mask = lengths_mask(num_stft_frames, num_frames, logits.dtype)
        frames = _masked(torch.fft.irfft(spec, n=n_fft, dim=1) * window[None, :, None], frame_mask)
        envelope = window.pow(2)[None, :, None].expand(logits.shape[0], n_fft, num_frames)
        envelope = _masked(envelope, frame_mask)
        total = n_fft + hop * (num_frames - 1)
        fold = functools.partial(F.fold, output_size=(1, total), kernel_size=(1, n_fft), stride=(1, hop))
        signal, envelope = fold(frames)[:, 0, 0], fold(envelope)[:, 0, 0]
        signal, envelope = signal[:, n_fft // 2: total - n_fft // 2], envelope[:, n_fft // 2: total - n_fft // 2]
        # The envelope only vanishes past an item's last frame, where decode zeroes the output.
        return signal / torch.where(envelope > 1e-11, envelope, torch.ones_like(envelope))


_GAIN = "parametrizations.weight.original0"  # g, shape (dim 0 of the weight, 1, 1)
_DIRECTION = "parametrizations.weight.original1"  # v, shape of the weight


def _weight_normed_module_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if getattr(module, WEIGHT_NORM_MARK, False)]


def canonical_weight_norm_names(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename legacy ``X.weight_g``/``X.weight_v`` keys to ``X.parametrizations.weight.original0/1``."""
    renamed = {}
    for key, value in state.items():
        if key.endswith(".weight_g"):
            key = key[: -len("weight_g")] + _GAIN
        elif key.endswith(".weight_v"):
            key = key[: -len("weight_v")] + _DIRECTION
        renamed[key] = value
    return renamed


def fold_weight_norm(module: nn.Module) -> nn.Module:
    """Replace every weight-norm parametrisation under ``module`` by its plain weight g * v / ||v||."""
    for sub in module.modules():
        if parametrize.is_parametrized(sub, "weight"):
            parametrize.remove_parametrizations(sub, "weight", leave_parametrized=True)
    return module
