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
        return self.integrate(noise, mask, mu, spks, cond, n_steps, guidance=self.guidance(cfg_rate))

    def guidance(self, cfg_rate: float) -> tuple[float, float] | None:
        """The guidance weights :meth:`integrate` takes for a CFG weight: ``(1 + w, w)``, or None
        when no guidance is applied (meanflow, or ``w == 0``)."""
        return None if self.meanflow or cfg_rate == 0.0 else (1.0 + cfg_rate, cfg_rate)

    def integrate(
        self,
        noise: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        n_steps: int,
        guidance: tuple[float, float] | tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """The Euler loop of :meth:`solve` with the guidance weights given directly:
        ``v = w_cond v(cond) - w_uncond v(uncond)``, or None for no guidance (meanflow: must be None).

        The weights are Python floats (what :meth:`solve` passes) or 0-dim float32 tensors on the
        solver's device, so that a captured CUDA graph can read them from memory; a product with a
        tensor weight is formed in float32 and rounded once to the model's dtype, exactly as a
        product with a Python scalar is, so both give the same values. The loop has no host
        synchronisation and no data-dependent control flow, so it can be captured as a whole.
        """
        dtype = self.estimator.final_proj.weight.dtype
        x = noise.to(dtype)
        mu, spks, cond = mu.to(dtype), spks.to(dtype), cond.to(dtype)
        batch = x.shape[0]
        times = time_grid(n_steps, self.meanflow, device=x.device, dtype=dtype)

        if self.meanflow:
            assert guidance is None, "meanflow solves take no guidance"
            for t, r in zip(times[:-1], times[1:]):
                velocity = self.estimator(
                    x, mask, mu, t.expand(batch), spks, cond, r=r.expand(batch)
                )
                x = x + (r - t) * velocity
            return x

        guided = guidance is not None
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
                velocity = _guide(*velocity.split(batch), *guidance)
            x = x + (r - t) * velocity
        return x


def _guide(v_cond: torch.Tensor, v_uncond: torch.Tensor, w_cond, w_uncond) -> torch.Tensor:
    """``w_cond * v_cond - w_uncond * v_uncond`` (see :meth:`ConditionalFlowMatching.integrate`)."""
    if isinstance(w_cond, torch.Tensor):
        dtype = v_cond.dtype
        return (v_cond.float() * w_cond).to(dtype) - (v_uncond.float() * w_uncond).to(dtype)
    return w_cond * v_cond - w_uncond * v_uncond
