"""Adam for the agents: PyTorch's fused kernel, called with less per-step bookkeeping."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class FusedAdam(torch.optim.Adam):
    """`torch.optim.Adam(fused=True)` (Adam with amsgrad, weight decay and maximize off), stepping through the
    same kernel with the same arguments, so its updates are bitwise PyTorch's.

    A small network's Adam step is mostly Python: PyTorch's `step` regroups every parameter's state by device
    and dtype on each call. Here the lists are built once, on the first step (which PyTorch's `step` takes,
    creating the state), and rebuilt after `load_state_dict`. State dicts are PyTorch's Adam's.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        super().__init__(params, lr=lr, fused=True)
        self._lists: list[tuple[dict, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                                list[torch.Tensor]]] | None = None  # per group: params, exp_avgs, exp_avg_sqs, steps

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            return super().zero_grad(set_to_none=False)
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._lists = None

    def __setstate__(self, state: dict) -> None:  # copies and unpickled optimisers rebuild their lists
        super().__setstate__(state)
        self._lists = None

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None or self._lists is None:
            loss = super().step(closure)
            self._lists = self._cached_lists()
            return loss
        for group, params, exp_avgs, exp_avg_sqs, steps in self._lists:
            grads = [param.grad for param in params]
            if any(grad is None for grad in grads):  # a parameter without gradient this step: PyTorch's rules
                return super().step()
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                               beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=group["weight_decay"],
                               eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)
        return None

    def _cached_lists(self):
        """Each group's tensors for the fast path, or None (PyTorch's step every time) where it does not apply:
        a parameter without state yet, several devices or dtypes in one group, or an option it does not cover."""
        lists = []
        for group in self.param_groups:
            params = group["params"]
            if (group["amsgrad"] or group["maximize"] or group["weight_decay"] != 0
                    or group.get("decoupled_weight_decay")
                    or isinstance(group["lr"], torch.Tensor) or any(p not in self.state for p in params)
                    or len({(p.device, p.dtype) for p in params}) > 1):
                return None
            states = [self.state[p] for p in params]
            lists.append((group, list(params), [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                          [s["step"] for s in states]))
        return lists


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
    """Adam with the fused kernel (`FusedAdam`); PyTorch's default Adam where the device or dtype has none;
    `ShapeOnlyAdam` for parameters on the meta device."""
    params = list(params)
    if any(param.is_meta for param in params):  # a memory estimate (protorl.resources): shapes, no values
        return ShapeOnlyAdam(params, lr=lr)
    try:
        return FusedAdam(params, lr)
    except (RuntimeError, TypeError):  # a device or dtype without a fused kernel
        return torch.optim.Adam(params, lr=lr)


def optimizer_step(loss: torch.Tensor, *optimizers: torch.optim.Optimizer) -> None:
    """One gradient step of `loss` for every optimiser."""
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    loss.backward()
    for optimizer in optimizers:
        optimizer.step()
