"""Euler solvers for S3Gen's flow matching: noise (t = 0) -> mel (t = 1).

Standard checkpoints integrate on a cosine time grid ``t_k = 1 - cos(pi/2 * k/n)`` with
classifier-free guidance ``v = (1 + w) v(cond) - w v(uncond)``, where the unconditional rows see
mu, speaker and cond all zeroed. Meanflow checkpoints take ``n`` steps on the linear grid
``t_k = k/n``; the estimator also receives the step's end time ``r = t_{k+1}`` and no guidance is
used (the model was distilled with it).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from chorus.models.s3gen.estimator import ConditionalDecoder, EstimatorConfig


def time_grid(n_steps: int, meanflow: bool, device=None, dtype=torch.float32) -> torch.Tensor:
    """The ``n_steps + 1`` flow times from 0 to 1 the solver visits."""
    grid = torch.linspace(0, 1, n_steps + 1, device=device, dtype=dtype)
    if meanflow:
        return grid
    return 1 - torch.cos(grid * 0.5 * math.pi)


class ConditionalFlowMatching(nn.Module):
    """Holds the estimator (key prefix ``estimator.``) and integrates its velocity field."""

    def __init__(self, config: EstimatorConfig, meanflow: bool = False):
        super().__init__()
        self.meanflow = meanflow
        self.estimator = ConditionalDecoder(config, meanflow=meanflow)

    def solve(
        self,
        noise: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_steps: int,
        cfg_rate: float,
    ) -> torch.Tensor:
        """Integrate from ``noise`` ``[B, 80, T]`` to a mel ``[B, 80, T]``.

        mask ``[B, T]`` bool (True = valid); mu, cond ``[B, 80, T]``; spks ``[B, 80]``.
        ``cfg_rate`` is ignored in meanflow mode. Frames past an item's length keep their noise.
        """
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        dtype = self.estimator.final_proj.weight.dtype
        x = noise.to(dtype)
        mu, spks, cond = mu.to(dtype), spks.to(dtype), cond.to(dtype)
        batch = x.shape[0]
        times = time_grid(n_steps, self.meanflow, device=x.device, dtype=dtype)

        if self.meanflow:
            for t, r in zip(times[:-1], times[1:]):
                velocity = self.estimator(
                    x, mask, mu, t.expand(batch), spks, cond, r=r.expand(batch)
                )
                x = x + (r - t) * velocity
            return x

        guided = cfg_rate != 0.0
        if guided:
            # Conditional rows first, then the same rows with every condition zeroed.
            mask = torch.cat([mask, mask])
            mu = torch.cat([mu, torch.zeros_like(mu)])
            spks = torch.cat([spks, torch.zeros_like(spks)])
            cond = torch.cat([cond, torch.zeros_like(cond)])
        rows = mu.shape[0]
        for t, r in zip(times[:-1], times[1:]):
            x_in = torch.cat([x, x]) if guided else x
            velocity = self.estimator(x_in, mask, mu, t.expand(rows), spks, cond)
            if guided:
                v_cond, v_uncond = velocity.split(batch)
                velocity = (1.0 + cfg_rate) * v_cond - cfg_rate * v_uncond
            x = x + (r - t) * velocity
        return x
