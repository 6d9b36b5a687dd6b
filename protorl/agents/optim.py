"""Adam for the agents: PyTorch's, with its fused kernel where the device has one."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class ShapeOnlyAdam(torch.optim.Adam):
    """Adam on the meta device, where tensors have shapes and no values: a step creates Adam's state (the moments
    of each parameter) and computes nothing."""

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if not self.state[param]:
                    self.state[param].update(step=torch.zeros((), device=param.device),
                                             exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))


def make_adam(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """`torch.optim.Adam(fused=True)`; PyTorch's default Adam where the device or dtype has no fused kernel;
    `ShapeOnlyAdam` for parameters on the meta device."""
    params = list(params)
    if any(param.is_meta for param in params):  # a memory estimate (protorl.app.resources): shapes, no values
        return ShapeOnlyAdam(params, lr=lr)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # a device or dtype without a fused kernel
        return torch.optim.Adam(params, lr=lr)


def optimizer_step(loss: torch.Tensor, *optimizers: torch.optim.Optimizer) -> None:
    """One gradient step of `loss` for every optimiser."""
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    loss.backward()
    for optimizer in optimizers:
        optimizer.step()
