"""The tensors an update writes in place beside its modules' parameters and buffers (Adam's moments, the candidate
queue, running statistics), held as buffers of a module of their own.

`torch.compile` takes a module's parameters and buffers as static inputs of a compiled graph, and a graph replayed as
a CUDA graph may write in place only into such inputs: a tensor written in place and held anywhere else (a list, a
plain object's attribute) makes inductor skip CUDA graphs for the whole update ("mutated inputs"). The buffers are
not persistent: no `state_dict` sees them, so checkpoints and snapshots keep their layout.
"""

from __future__ import annotations

import torch
from torch import nn


class InPlaceTensors(nn.Module):
    """`InPlaceTensors(name=tensor, ...)`: each tensor (the same object, not a copy) as a non-persistent buffer."""

    def __init__(self, **tensors: torch.Tensor):
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)
