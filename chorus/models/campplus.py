"""CAM++ speaker encoder: the 192-d x-vector S3Gen conditions on.

Input: 80-bin Kaldi fbank of 16 kHz audio with the per-utterance mean removed (CMN). Network: a
2-D residual front end (FCM) that folds 80 frequency bins into 320 channels, a stride-2 TDNN,
three densely connected blocks of context-aware-masking (CAM) layers with transition layers,
mean + standard deviation pooling over time, and a 1x1 projection with a final non-affine
BatchNorm. All BatchNorms use their stored statistics.

Keys are the official ``speaker_encoder.*`` entries of ``s3gen.safetensors`` (without the prefix).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from chorus.models.checkpoint import check_state_dict, meta_shapes, strip_prefix
from chorus.models.fbank import KaldiFbankConfig, kaldi_fbank


@dataclass(frozen=True)
class CAMPPlusConfig:
    feat_dim: int = 80
    embed_size: int = 192
    head_channels: int = 32
    growth_rate: int = 32
    bottleneck_scale: int = 4  # CAM layers squeeze to bottleneck_scale * growth_rate channels
    init_channels: int = 128
    # (layers, dilation) of the three dense blocks; every CAM layer has kernel size 3
    blocks: tuple[tuple[int, int], ...] = ((12, 1), (24, 2), (16, 2))
    segment_frames: int = 100  # CAM context: segment-average pooling window
    fbank: KaldiFbankConfig = KaldiFbankConfig()


class _BatchNormReLU(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.batchnorm = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.batchnorm(x))


class _ResBlock2d(nn.Module):
    def __init__(self, channels: int, freq_stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=(freq_stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if freq_stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, channels, 1, stride=(freq_stride, 1), bias=False), nn.BatchNorm2d(channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _FrequencyFrontEnd(nn.Module):
    """(B, 1, F, T) -> (B, C * F / 8, T): three stride-2 steps along frequency only."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(_ResBlock2d(channels, 2), _ResBlock2d(channels, 1))
        self.layer2 = nn.Sequential(_ResBlock2d(channels, 2), _ResBlock2d(channels, 1))
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))
        return out.flatten(1, 2)


class _TDNN(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 5, stride=2, padding=2, bias=False)
        self.nonlinear = _BatchNormReLU(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class _CAMLayer(nn.Module):
    """A local convolution gated by a context mask from the utterance and segment means."""

    def __init__(self, channels: int, out_channels: int, dilation: int, segment_frames: int):
        super().__init__()
        self.segment_frames = segment_frames
        self.linear_local = nn.Conv1d(channels, out_channels, 3, padding=dilation, dilation=dilation, bias=False)
        self.linear1 = nn.Conv1d(channels, channels // 2, 1)
        self.linear2 = nn.Conv1d(channels // 2, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.linear_local(x)
        frames = x.shape[-1]
        segments = F.avg_pool1d(x, self.segment_frames, self.segment_frames, ceil_mode=True)
        segment_means = segments.repeat_interleave(self.segment_frames, dim=-1)[..., :frames]
        context = x.mean(-1, keepdim=True) + segment_means
        mask = torch.sigmoid(self.linear2(F.relu(self.linear1(context))))
        return local * mask


class _CAMDenseLayer(nn.Module):
    def __init__(self, in_channels: int, cfg: CAMPPlusConfig, dilation: int):
        super().__init__()
        bottleneck = cfg.bottleneck_scale * cfg.growth_rate
        self.nonlinear1 = _BatchNormReLU(in_channels)
        self.linear1 = nn.Conv1d(in_channels, bottleneck, 1, bias=False)
        self.nonlinear2 = _BatchNormReLU(bottleneck)
        self.cam_layer = _CAMLayer(bottleneck, cfg.growth_rate, dilation, cfg.segment_frames)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class _CAMDenseBlock(nn.Module):
    """Each layer's output is concatenated to its input (DenseNet style)."""

    def __init__(self, num_layers: int, in_channels: int, cfg: CAMPPlusConfig, dilation: int):
        super().__init__()
        for i in range(num_layers):
            self.add_module(f"tdnnd{i + 1}", _CAMDenseLayer(in_channels + i * cfg.growth_rate, cfg, dilation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.children():
            x = torch.cat([x, layer(x)], dim=1)
        return x


class _Transit(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.nonlinear = _BatchNormReLU(in_channels)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class _StatsPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class _Dense(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.nonlinear = nn.Module()
        self.nonlinear.batchnorm = nn.BatchNorm1d(out_channels, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear.batchnorm(self.linear(x.unsqueeze(-1)).squeeze(-1))


class CAMPPlus(nn.Module):
    """The x-vector network. Use :meth:`embed` on 16 kHz waveforms, or call it on features."""

    def __init__(self, config: CAMPPlusConfig = CAMPPlusConfig()):
        super().__init__()
        self.config = config
        self.head = _FrequencyFrontEnd(config.head_channels)
        channels = config.head_channels * (config.feat_dim // 8)
        layers: list[tuple[str, nn.Module]] = [("tdnn", _TDNN(channels, config.init_channels))]
        channels = config.init_channels
        for i, (num_layers, dilation) in enumerate(config.blocks, start=1):
            layers.append((f"block{i}", _CAMDenseBlock(num_layers, channels, config, dilation)))
            channels += num_layers * config.growth_rate
            layers.append((f"transit{i}", _Transit(channels, channels // 2)))
            channels //= 2
        layers.append(("out_nonlinear", _BatchNormReLU(channels)))
        layers.append(("stats", _StatsPool()))
        layers.append(("dense", _Dense(2 * channels, config.embed_size)))
        self.xvector = nn.Sequential(OrderedDict(layers))

    @classmethod
    def checkpoint_shapes(cls, config: CAMPPlusConfig = CAMPPlusConfig()) -> dict[str, tuple[int, ...]]:
        return meta_shapes(lambda: cls(config))

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, torch.Tensor], *, config: CAMPPlusConfig = CAMPPlusConfig(),
        prefix: str = "", device: torch.device | str = "cpu", source: str = "CAMPPlus state dict",
    ) -> "CAMPPlus":
        """Build an eval-mode fp32 model from official weights.

        ``state`` may be a whole ``s3gen`` state dict with ``prefix="speaker_encoder."``; keys
        outside the prefix are ignored. BatchNorm ``num_batches_tracked`` counters may be absent.
        """
        own = strip_prefix(state, prefix)
        shapes = cls.checkpoint_shapes(config)
        counters = frozenset(k for k in shapes if k.endswith("num_batches_tracked"))
        check_state_dict(own, shapes, source + (f" [{prefix}*]" if prefix else ""), optional=counters)
        weights = {k: (v.to(device) if k in counters else v.to(device=device, dtype=torch.float32))
                   for k, v in own.items()}
        for key in counters - weights.keys():
            weights[key] = torch.zeros((), dtype=torch.long, device=device)
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(weights, strict=True, assign=True)
        return model.eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.head.conv1.weight.device

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, T, feat_dim) mean-normalised fbank -> (B, embed_size) x-vectors (not L2-normalised)."""
        x = self.head(feats.transpose(1, 2).unsqueeze(1))
        return self.xvector(x)

    def features(self, wav: torch.Tensor) -> torch.Tensor:
        """CMN'd fbank (T, feat_dim) (or (B, T, feat_dim) for equal-length (B, L)) of 16 kHz audio."""
        feats = kaldi_fbank(wav, self.config.fbank)
        return feats - feats.mean(dim=-2, keepdim=True)

    @torch.inference_mode()
    def embed(self, wavs: Sequence[np.ndarray | torch.Tensor] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """x-vectors (B, embed_size) of 16 kHz waveforms at [-1, 1] scale, on the model's device.

        Clips of equal length run as one batch; each clip gets exactly the vector it would get
        alone (no padding enters the statistics). Clips need at least 400 samples (25 ms).
        """
        if isinstance(wavs, (np.ndarray, torch.Tensor)) and wavs.ndim == 1:
            wavs = [wavs]
        if len(wavs) == 0:
            raise ValueError("embed needs at least one waveform")
        wavs = [torch.as_tensor(w).to(device=self.device, dtype=torch.float32) for w in wavs]
        out = torch.empty(len(wavs), self.config.embed_size, device=self.device)
        by_length: dict[int, list[int]] = {}
        for i, w in enumerate(wavs):
            by_length.setdefault(w.shape[-1], []).append(i)
        for indices in by_length.values():
            batch = torch.stack([wavs[i] for i in indices])
            out[indices] = self(self.features(batch))
        return out
