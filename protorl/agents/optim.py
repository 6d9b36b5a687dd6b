"""Adam for the agents, and the gradient step an update is written with, so that a whole update can be one graph.

`gradient_step(loss_fn, args, *optimizers)` takes the gradient of `loss_fn(*args)` with respect to the optimisers'
parameters and steps each optimiser. Run eagerly, that is `torch.autograd.grad` and
`torch.optim.Adam(fused=True)`'s kernel, the arithmetic of `loss.backward(); optimizer.step()` bit for bit.
Inside `torch.compile`, which traces neither with public settings, the gradient comes from
`torch.func.grad_and_value` (the parameters swapped into their modules by `torch.func.functional_call` while
`loss_fn` runs) and Adam from PyTorch's traceable multi-tensor implementation: the same algorithm, other rounding.
`loss_fn` must not write into tensors it did not create (`torch.func` forbids it): running statistics are
updated from its auxiliary outputs, after the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad_and_value
from torch.optim.adam import adam

from protorl.agents.inplace import InPlaceTensors

STATE_KEYS = ("exp_avg", "exp_avg_sq", "step")  # Adam's state of each parameter, in `apply`'s order


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
    if any(param.is_meta for param in params):  # a snapshot's check (protorl.storage.snapshots): shapes, no values
        return ShapeOnlyAdam(params, lr=lr)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # a device or dtype without a fused kernel
        return torch.optim.Adam(params, lr=lr)


class _Modules(nn.Module):
    """Modules under one root, so that `functional_call` can swap all their parameters while a function runs."""

    def __init__(self, modules: dict[str, nn.Module]):
        super().__init__()
        for key, module in modules.items():
            self.add_module(key, module)

    def forward(self, fn: Callable, *args: Any) -> Any:
        return fn(*args)


class Adam:
    """Adam over every parameter of `modules` (in their order), stepped by `gradient_step`.

    Its state is a `torch.optim.Adam`'s (what checkpoints save and load). The state tensors exist from the start
    and loading copies into them, so a compiled update always reads the same tensors.
    """

    def __init__(self, modules: dict[str, nn.Module], lr: float):
        self.root = _Modules(modules)
        self.names = [name for name, _ in self.root.named_parameters()]
        self.params = [param for _, param in self.root.named_parameters()]
        self.optimizer = make_adam(self.params, lr)
        self.shapes_only = any(param.is_meta for param in self.params)  # a snapshot's check: no arithmetic
        if not self.shapes_only:
            self._create_state()
            states = [self.optimizer.state[param] for param in self.params]
            # the optimizer's own state tensors, which a compiled update reads from a module (protorl.agents.inplace)
            self.state_tensors = InPlaceTensors(**{f"{key}{index}": state[key] for key in STATE_KEYS
                                                   for index, state in enumerate(states)})


    @torch.no_grad()
    def _create_state(self) -> None:
        """Adam's state as `torch.optim.Adam` creates it on its first step, at step 0: a step on zero gradients
        (which moves no parameter), its step count then reset."""
        for param in self.params:
            param.grad = torch.zeros_like(param)
        self.optimizer.step()
        for param in self.params:
            param.grad = None
            self.optimizer.state[param]["step"].zero_()

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Load a `state_dict()` into the existing state tensors (a state saved before any step zeroes them)."""
        own = {param: dict(self.optimizer.state[param]) for param in self.params}
        self.optimizer.load_state_dict(state)
        for param in self.params:
            loaded = self.optimizer.state[param]
            for key, tensor in own[param].items():
                tensor.copy_(loaded[key]) if key in loaded else tensor.zero_()
            self.optimizer.state[param] = own[param]

    def apply(self, grads: list[torch.Tensor]) -> None:
        """One Adam step of every parameter with `grads` (one per parameter, in order)."""
        if self.shapes_only:
            self.optimizer.step()
            return
        tensors, n = list(self.state_tensors.buffers()), len(self.params)
        exp_avgs, exp_avg_sqs, steps = (tensors[i * n:(i + 1) * n] for i in range(len(STATE_KEYS)))
        group = self.optimizer.param_groups[0]  # its hyper-parameters as they are now (a change recompiles)
        kernel = dict(foreach=True, capturable=True, fused=None) if torch.compiler.is_compiling() else dict(
            foreach=group["foreach"], capturable=group["capturable"], fused=group["fused"])
        adam(self.params, grads, exp_avgs, exp_avg_sqs, [], steps, **kernel, amsgrad=False, maximize=False,
             beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"], weight_decay=group["weight_decay"],
             eps=group["eps"])


def gradient_step(loss_fn: Callable[..., tuple[torch.Tensor, Any]], args: tuple, *optimizers: Adam
                  ) -> tuple[torch.Tensor, Any]:
    """One step of every optimiser on the gradient of `loss_fn(*args)`'s loss with respect to its parameters.

    `loss_fn` returns `(loss, aux)`, the loss a 0-d tensor; it reads the parameters through the optimisers'
    modules as usual. Returns the loss and `aux` (tensors in a tuple, or one tensor), detached, as computed
    before the step.
    """
    params = [param for optimizer in optimizers for param in optimizer.params]
    if torch.compiler.is_compiling():
        grads, (loss, aux) = _traced_gradient(loss_fn, args, optimizers)
    else:
        with torch.enable_grad():
            loss, aux = loss_fn(*args)
            grads = torch.autograd.grad(loss, params)
        aux = _detached(aux)
    start = 0
    for optimizer in optimizers:
        optimizer.apply(list(grads[start:start + len(optimizer.params)]))
        start += len(optimizer.params)
    return loss.detach(), aux


def _detached(value: Any) -> Any:
    """Tensors in (nested) tuples detached; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple):
        return tuple(_detached(item) for item in value)
    return value


def _traced_gradient(loss_fn: Callable[..., tuple[torch.Tensor, Any]], args: tuple, optimizers: tuple[Adam, ...]
                     ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, Any]]:
    """`torch.func.grad_and_value` of `loss_fn(*args)` with respect to the optimisers' parameters."""
    sizes = [len(optimizer.params) for optimizer in optimizers]

    def run(index: int, values: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Any]:
        if index == len(optimizers):
            return loss_fn(*args)
        optimizer, own, rest = optimizers[index], values[:sizes[index]], values[sizes[index]:]
        return functional_call(optimizer.root, dict(zip(optimizer.names, own, strict=True)), (run, index + 1, rest))

    params = tuple(param.detach() for optimizer in optimizers for param in optimizer.params)
    return grad_and_value(lambda values: run(0, values), has_aux=True)(params)
