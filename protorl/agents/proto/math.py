"""The math of Proto-RL as pure functions and two small modules (section 4, appendix D).

- `sinkhorn`: equal-partition cluster assignments for the target network (the SSL target q_{t+1}).
- `cluster_assignment_loss`: L_SSL = -(q_{t+1} * log p_t).sum(1).mean().
- `sample_candidates`: one prototype-balanced candidate per prototype from a batch of projections.
- `knn_reward`: L2 distance to the k-th nearest candidate (`protorl.agents.knn`), the entropy-based intrinsic reward.
- `CandidateQueue`: the FIFO queue Q of M x T candidates.
- `Projector`: the projector g, with the optional anti-collapse step (a departure, off in the paper preset).
- `ProtoHead`: projector g, predictor v and prototypes C.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from protorl.agents.inplace import InPlaceTensors
from protorl.agents.knn import nearest_distances
from protorl.agents.networks import orthogonal_init


def sinkhorn(scores: torch.Tensor, n_iters: int = 3) -> torch.Tensor:
    """Sinkhorn-Knopp cluster assignments (appendix D, after Cuturi 2013 and SwAV).

    scores: (B, M) dot products of L2-normalised projections and prototypes, already divided by tau.
    Returns (B, M) assignments whose rows sum to 1; each prototype gets ~B/M of the batch's mass.
    Computed in log space and float64, which equals the paper's exp-and-rescale iterations but stays
    finite for any finite scores (a B x M matrix: the cost is negligible).
    """
    batch_size, num_prototypes = scores.shape
    log_q = scores.t().double()  # (M, B)
    log_q = log_q - torch.logsumexp(log_q.reshape(-1), dim=0)  # Q /= Q.sum()
    for _ in range(n_iters):
        # rows (prototypes) to 1/M each, then columns (samples) to 1/B each
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) - math.log(num_prototypes)
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - math.log(batch_size)
    q = torch.softmax(log_q, dim=0)  # columns renormalised to sum to 1
    return q.t().to(scores.dtype)  # (B, M)


def cluster_assignment_loss(log_p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """L_SSL = -(q_{t+1} * log p_t).sum(1).mean(). log_p, q: (B, M) -> scalar."""
    return -(q * log_p).sum(dim=1).mean()


def sample_candidates(z: torch.Tensor, prototypes: torch.Tensor, generator: torch.Generator | None = None,
                      points: torch.Tensor | None = None) -> torch.Tensor:
    """One candidate per prototype, drawn from a softmax over the batch (section 4.2).

    z: (B, D) L2-normalised projections; prototypes: (M, D) L2-normalised. For prototype j the
    candidate is z_i with probability softmax_i(z_i . c_j). Returns (M, D): rows of `points` (B, D'), the
    batch in the reward's space (`ProtoHead.reward_embedding`), or of z itself.
    The draw is `torch.multinomial(weights, 1)`'s own, written out (argmax of the weights over exponential noise,
    the same noise from the same generator): the same indices, without its checks that read the weights back to
    the host.
    """
    weights = torch.softmax(prototypes @ z.t(), dim=1)  # (M, B)
    noise = torch.empty_like(weights).exponential_(1, generator=generator)  # (M, B)
    index = torch.argmax(weights / noise, dim=1)  # (M,)
    return (z if points is None else points)[index]


def knn_reward(z: torch.Tensor, queue: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Distance to the k-th nearest queue entry (eq. 2): (B, D), (N, D) -> (B, 1)."""
    return nearest_distances(z, queue, k)[:, -1:]


class CandidateQueue:
    """FIFO queue of `capacity` candidate projections (M x T in the paper); the oldest leave first.

    The next row to overwrite is kept on the device, so enqueueing never waits for the host; the number of rows
    filled, which only grows until the queue is full, is kept on the host.
    """

    def __init__(self, capacity: int, dim: int, device: torch.device | str = "cpu"):
        self.tensors = InPlaceTensors(items=torch.zeros(capacity, dim, device=device),  # (capacity, D)
                                      next_row=torch.zeros((), dtype=torch.long, device=device))  # next to overwrite
        self.size = 0  # rows filled so far

    @property
    def items(self) -> torch.Tensor:
        return self.tensors.items

    @property
    def next_row(self) -> torch.Tensor:
        return self.tensors.next_row

    @property
    def capacity(self) -> int:
        return self.items.shape[0]

    @property
    def pointer(self) -> int:
        """The next row to overwrite (read back from the device; 0 on the meta device, which holds no values)."""
        return 0 if self.next_row.is_meta else int(self.next_row)

    def enqueue(self, candidates: torch.Tensor) -> None:
        """Append (n, D) rows, overwriting the oldest ones once full."""
        n = candidates.shape[0]
        rows = (self.next_row + torch.arange(n, device=self.items.device)) % self.capacity  # (n,)
        self.items[rows] = candidates
        self.next_row.copy_((self.next_row + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def filled(self) -> torch.Tensor:
        """The rows enqueued so far: (size, D)."""
        return self.items if self.size == self.capacity else self.items[: self.size]

    @property
    def full(self) -> bool:
        return self.size == self.capacity

    def state_dict(self) -> dict:
        return {"items": self.items.clone(), "pointer": self.pointer, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.items.copy_(state["items"])
        self.next_row.fill_(int(state["pointer"]))
        self.size = int(state["size"])


ANTI_COLLAPSE = ("none", "center", "batchnorm")
REWARD_SPACES = ("sphere", "raw")
BATCHNORM_EPS = 1e-5  # BatchNorm1d's default


class Projector(nn.Module):
    """g: representation (B, R) -> projection (B, D) before L2 normalisation: a linear map, then the
    anti-collapse step `anti_collapse` (a departure from the paper unless "none").

    - "none": the paper's linear projector.
    - "center": subtract the mean projection. The projector's inputs are ReLU features (all >= 0), so raw
      projections share one direction that Adam's first steps amplify until every frame projects to the same
      point; removing the mean removes that direction (and the loss's gradient along it).
    - "batchnorm": BatchNorm1d (centring, unit variance per dimension, learned affine), SwAV's head.

    `batch_stats=True` normalises with this batch's statistics (the SSL loss); `update_statistics` then folds them
    into running statistics with `momentum` (in training mode); `batch_stats=False` uses the running statistics,
    so a frame's projection does not depend on the rest of its batch (the reward, the analyses, downstream). The
    first 1 / momentum batches are averaged cumulatively, so after one SSL step the running mean is that batch's.
    Every variant also tracks `running_spread`, the mean squared distance of a batch's outputs from their mean:
    the unit of the "raw" reward space (`ProtoHead.reward_embedding`).
    """

    def __init__(self, repr_dim: int, proj_dim: int, anti_collapse: str = "none", momentum: float = 0.1):
        super().__init__()
        if anti_collapse not in ANTI_COLLAPSE:
            raise ValueError(f"anti_collapse must be one of {ANTI_COLLAPSE}, got {anti_collapse!r}")
        self.linear = nn.Linear(repr_dim, proj_dim)
        self.anti_collapse, self.momentum = anti_collapse, momentum
        self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))
        self._batches_seen = 0  # the same count on the host, until the momentum settles
        self._settled = 1.0 <= momentum
        self.register_load_state_dict_post_hook(Projector._count_from_buffer)
        self.register_buffer("running_spread", torch.ones(()))
        if anti_collapse != "none":
            self.register_buffer("running_mean", torch.zeros(proj_dim))
        if anti_collapse == "batchnorm":
            self.register_buffer("running_var", torch.ones(proj_dim))
            self.weight = nn.Parameter(torch.ones(proj_dim))
            self.bias = nn.Parameter(torch.zeros(proj_dim))

    def forward(self, y: torch.Tensor, batch_stats: bool = False) -> torch.Tensor:
        return self.anti_collapse_step(self.linear(y), batch_stats)

    def anti_collapse_step(self, x: torch.Tensor, batch_stats: bool = False) -> torch.Tensor:
        """The linear map's outputs (B, D) -> the projections (B, D) (identity for "none", the paper), with this
        batch's statistics or the running ones; the running statistics change only in `update_statistics`."""
        if self.anti_collapse == "center":
            return x - (x.mean(dim=0) if batch_stats else self.running_mean)
        if self.anti_collapse == "batchnorm":
            return F.batch_norm(x, None if batch_stats else self.running_mean,
                                None if batch_stats else self.running_var, self.weight, self.bias,
                                training=batch_stats, eps=BATCHNORM_EPS)
        return x

    @property
    def settled(self) -> bool:
        """Whether the running statistics' momentum has reached `momentum` (after about 1 / momentum batches)."""
        return self._settled

    @torch.no_grad()
    def update_statistics(self, linear: torch.Tensor, projected: torch.Tensor) -> None:
        """Fold one batch into the running statistics (in training mode): `linear` (B, D), the linear map's
        outputs, and `projected` (B, D), the projections `anti_collapse_step(linear, batch_stats=True)` gave."""
        if not self.training:
            return
        momentum = self.momentum
        if not self._settled:  # the first batches: a cumulative average, counted on the host
            momentum = max(self.momentum, 1.0 / (self._batches_seen + 1))
            self._batches_seen += 1
            self._settled = 1.0 / (self._batches_seen + 1) <= self.momentum
        if self.anti_collapse == "center":
            self.running_mean.lerp_(linear.mean(dim=0), momentum)
        elif self.anti_collapse == "batchnorm":  # BatchNorm's own update of its running mean and (unbiased) variance
            F.batch_norm(linear, self.running_mean, self.running_var, training=True, momentum=momentum,
                         eps=BATCHNORM_EPS)
        self.running_spread.lerp_((projected - projected.mean(dim=0)).square().sum(dim=1).mean(), momentum)
        self.batches_seen += 1

    @staticmethod
    def _count_from_buffer(module: Projector, incompatible_keys) -> None:
        module._batches_seen = int(module.batches_seen)  # once per loaded state, not per batch
        module._settled = 1.0 / (module._batches_seen + 1) <= module.momentum


class ProtoHead(nn.Module):
    """Projector g (repr -> D), predictor v (D -> hidden -> D) and M prototypes of dimension D.

    Initialised as the paper's code does: orthogonal weights and zero biases; the (M, D) prototype matrix
    orthogonal (orthonormal columns), then each prototype scaled to unit norm.
    """

    def __init__(self, repr_dim: int, proj_dim: int = 128, pred_hidden_dim: int = 512,
                 num_prototypes: int = 512, anti_collapse: str = "none", anti_collapse_momentum: float = 0.1):
        super().__init__()
        self.projector = Projector(repr_dim, proj_dim, anti_collapse, anti_collapse_momentum)
        self.predictor = nn.Sequential(nn.Linear(proj_dim, pred_hidden_dim), nn.ReLU(),
                                       nn.Linear(pred_hidden_dim, proj_dim))
        self.prototypes = nn.Parameter(torch.empty(num_prototypes, proj_dim))  # (M, D)
        self.apply(orthogonal_init)
        nn.init.orthogonal_(self.prototypes)
        self.normalize_prototypes_()

    @torch.no_grad()
    def normalize_prototypes_(self) -> None:
        """L2-normalise every prototype in place: at creation, after every SSL step and on loading, so they are
        unit-norm whenever used (the paper's code normalises them before each use)."""
        self.prototypes.copy_(F.normalize(self.prototypes, dim=1))

    def project(self, y: torch.Tensor) -> torch.Tensor:
        """(B, repr) -> L2-normalised projections z (B, D), with the running statistics."""
        return F.normalize(self.projector(y), dim=1)

    def reward_embedding(self, raw: torch.Tensor, reward_space: str) -> torch.Tensor:
        """The space of the k-NN reward, from projections before L2 normalisation, raw (B, D) -> (B, D).

        "sphere" (the paper): L2-normalised. "raw": divided by the running RMS spread of the projections, so
        distances between typical frames are about sqrt(2), as between random unit vectors. Centred projections
        (anti_collapse) must not be L2-normalised for the reward: a frame projected near the mean would get an
        arbitrary direction, far from every candidate, and a high reward where the agent has been most.
        """
        if reward_space not in REWARD_SPACES:
            raise ValueError(f"reward_space must be one of {REWARD_SPACES}, got {reward_space!r}")
        if reward_space == "sphere":
            return F.normalize(raw, dim=1)
        return raw * self.projector.running_spread.clamp_min(1e-12).rsqrt()
