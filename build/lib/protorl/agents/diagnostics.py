"""Collapse diagnostics of a learned projection, logged on every update of an agent that learns one (`repr/*`).

- `repr/distinct_prototypes`: how many prototypes are the nearest one (argmax z . c) of some frame of the
  batch; 1 when every frame looks the same to the prototypes.
- `repr/target_entropy`: mean entropy of the Sinkhorn targets q (nats), on SSL steps. It reaches log M, its
  maximum, when the targets are uniform: the loss then says nothing about the frames.
- `repr/projection_spread`: median pairwise L2 distance of the batch's L2-normalised projections as the method
  uses them (after any anti-collapse step); 0 for one point, about 1.41 for independent random directions.
- `repr/shared_direction`: |mean raw projection| / mean |raw projection|, in [0, 1], for the linear projector's
  outputs (before any anti-collapse step). 1 when every frame projects to the same point. Centring or
  BatchNorm would turn the residual noise of such a collapse into well-spread directions that the three other
  figures read as healthy; this one keeps the scale, so it sees the collapse whatever the variant.

The projections measured are those of the reward (x_{t+1} through the online encoder and projector).
A representation is reported collapsed (`collapse_message`) when either signal says so: Sinkhorn targets uniform
to within `COLLAPSE_ENTROPY_MARGIN` nats, or a shared direction above `COLLAPSE_SHARED_DIRECTION` (every raw
projection within about 1.4% of their common length from the others).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

COLLAPSE_ENTROPY_MARGIN = 0.01  # nats below log M
COLLAPSE_SHARED_DIRECTION = 0.9999  # the paper's head reaches 0.99997 within ~10 updates (docs/collapse.md)
COLLAPSE_HINT = "see docs/collapse.md for agent.anti_collapse"
PROJECTION_METRICS = ("repr/projection_spread", "repr/shared_direction")  # of `projection_diagnostics`
PROTOTYPE_METRICS = ("repr/distinct_prototypes", "repr/target_entropy")  # of agents with prototypes


@torch.no_grad()
def sinkhorn_entropy(q: torch.Tensor) -> torch.Tensor:
    """Mean entropy of the rows of assignments q (B, M), in nats: a 0-d tensor."""
    return -(q * q.clamp_min(1e-30).log()).sum(dim=1).mean()


@torch.no_grad()
def projection_diagnostics(raw: torch.Tensor, used: torch.Tensor | None = None,
                           prototypes: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`repr/*` of a batch as 0-d tensors: raw (B, D) the linear projector's outputs; used (B, D) the projections
    before L2 normalisation as the method uses them (default: raw); with prototypes (M, D), the distinct nearest
    ones. Nothing is read back to the host."""
    z = F.normalize(raw if used is None else used, dim=1)  # (B, D)
    metrics = {
        "repr/projection_spread": torch.pdist(z).median() if len(z) > 1 else z.new_zeros(()),
        "repr/shared_direction": raw.mean(dim=0).norm() / raw.norm(dim=1).mean().clamp_min(1e-30),
    }
    if prototypes is not None:
        nearest = (z @ prototypes.t()).argmax(dim=1)  # (B,)
        metrics["repr/distinct_prototypes"] = z.new_zeros(len(prototypes)).index_fill_(0, nearest, 1.0).sum()
    return metrics


def collapse_message(row: dict, num_prototypes: int | None) -> str | None:
    """A one-line warning if a logged row (episode means) shows a collapsed representation, else None.

    num_prototypes: M, for the target-entropy test (None: agents without prototypes, shared direction only)."""
    entropy, shared = row.get("repr/target_entropy"), row.get("repr/shared_direction")
    uniform = entropy is not None and num_prototypes is not None and \
        entropy > math.log(num_prototypes) - COLLAPSE_ENTROPY_MARGIN
    if not uniform and (shared is None or shared <= COLLAPSE_SHARED_DIRECTION):
        return None
    figures = [f"{key.split('/')[1].replace('_', ' ')} {row[key]:.4g}" for key in
               ("repr/target_entropy", "repr/distinct_prototypes", "repr/projection_spread", "repr/shared_direction")
               if row.get(key) is not None]
    reason = (f"Sinkhorn targets uniform (log M = {math.log(num_prototypes):.4f})" if uniform
              else "every frame projects to nearly the same point")
    return f"the representation has collapsed at frame {row['frames']}: {reason}; {', '.join(figures)}; {COLLAPSE_HINT}"
