"""Encoders, actor and critic (appendix C.2 and C.4)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp(input_dim: int, hidden_dim: int, output_dim: int, hidden_depth: int) -> nn.Sequential:
    """`hidden_depth` hidden layers of `hidden_dim` units with ReLU, then a linear output."""
    layers: list[nn.Module] = []
    dim = input_dim
    for _ in range(hidden_depth):
        layers += [nn.Linear(dim, hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, output_dim))
    return nn.Sequential(*layers)


def orthogonal_init(module: nn.Module) -> None:
    """Orthogonal weights, zero biases (as in pytorch_sac, which the paper's SAC is based on)."""
    if isinstance(module, nn.Linear):
        nn.init.orthogonal_(module.weight.data)
        if module.bias is not None:
            module.bias.data.fill_(0.0)
    elif isinstance(module, nn.Conv2d):
        gain = nn.init.calculate_gain("relu")
        nn.init.orthogonal_(module.weight.data, gain)
        if module.bias is not None:
            module.bias.data.fill_(0.0)


class PixelEncoder(nn.Module):
    """SAC-AE conv encoder: 4 conv layers, 3x3, 32 channels, stride 2 then 1, ReLU, flattened.

    (B, 9, 84, 84) uint8 -> (B, 32 * 35 * 35 = 39200) float. Pixels are divided by 255. Features are
    flattened in (height, width, channel) order, a fixed permutation of the usual (C, H, W) order.

    `micro_batch`: convolve at most this many samples at a time (0: the whole batch). A CPU convolves a
    large batch ~1.7x slower per sample than small ones, whose activations stay in cache
    (benchmarks/bench_update.py measures it); autograd then runs the backward pass per micro-batch too,
    accumulating the weight gradients. The result equals the whole-batch pass to float rounding.
    `bf16`: run the convolutions under bfloat16 autocast (features are returned as float32).
    """

    def __init__(self, obs_shape: tuple[int, ...], channels: int = 32, micro_batch: int = 0, bf16: bool = False):
        super().__init__()
        in_channels = obs_shape[0]
        self.micro_batch, self.bf16 = micro_batch, bf16
        self.convnet = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, stride=2), nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, stride=1), nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, stride=1), nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, stride=1), nn.ReLU(inplace=True),
        )
        with torch.no_grad():
            self.repr_dim = int(math.prod(self.convnet(torch.zeros(1, *obs_shape)).shape[1:]))
        self.apply(orthogonal_init)
        # channels-last lets oneDNN (CPU) and cuDNN pick their fastest convolution kernels
        self.to(memory_format=torch.channels_last)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if 0 < self.micro_batch < obs.shape[0]:
            return torch.cat([self._encode(part) for part in obs.split(self.micro_batch)])
        return self._encode(obs)

    def _encode(self, obs: torch.Tensor) -> torch.Tensor:
        # channels-last (a copy of the uint8 pixels, unless they are so already), then to float32 in that layout
        x = obs.contiguous(memory_format=torch.channels_last) * (1.0 / 255.0)
        with torch.autocast(x.device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext():
            h = self.convnet(x)  # (B, 32, 35, 35) stored channels-last
        return h.float().permute(0, 2, 3, 1).flatten(1)  # flattened in storage order (H, W, C): a view, no copy


class StateEncoder(nn.Module):
    """Replaces the conv encoder for `env.obs=states`: MLP (S -> hidden -> hidden), ReLU after each layer."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_dim: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_shape[0], hidden_dim), nn.ReLU(inplace=True),
                                 nn.Linear(hidden_dim, hidden_dim), nn.ReLU(inplace=True))
        self.repr_dim = hidden_dim
        self.apply(orthogonal_init)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


# Slices of 16-32 samples keep a convolution's activations in cache: at batch 512 on this project's CPU the
# pre-training update ran 1.17x faster in slices of 32 than of 256 (benchmarks/bench_update.py searches the
# rates). Forward passes are bitwise the same in any slicing; only the weight gradients of batches above 32 are
# summed slice by slice, so every run at batch <= 32 computes exactly what the whole-batch pass computes.
CPU_MICRO_BATCH = 32


def micro_batch_for(device: torch.device, configured: int | None) -> int:
    """The encoder's micro-batch: `configured`, or for None, `CPU_MICRO_BATCH` on a CPU and the whole batch (0)
    on an accelerator, where large batches are the fast ones."""
    if configured is not None:
        return configured
    return CPU_MICRO_BATCH if device.type == "cpu" else 0


def make_encoder(obs_type: str, obs_shape: tuple[int, ...], state_hidden_dim: int, micro_batch: int = 0,
                 bf16: bool = False) -> nn.Module:
    """The conv encoder for pixels (`micro_batch`, `bf16`: see `PixelEncoder`), an MLP for states."""
    if obs_type == "pixels":
        return PixelEncoder(obs_shape, micro_batch=micro_batch, bf16=bf16)
    return StateEncoder(obs_shape, state_hidden_dim)


class SquashedNormal:
    """tanh(N(mu, sigma)): the SAC policy distribution; `mean` is tanh(mu).

    The same arithmetic as `torch.distributions.TransformedDistribution(Normal(mu, sigma), TanhTransform())`,
    written out: no argument validation (which reads tensors back to the host) and no transform machinery. The
    log-probability of a sample from `rsample` reuses its pre-tanh value, as the transform's cache does.
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor):
        self.loc, self.scale = loc, scale  # (B, |A|) each
        self._pre_tanh: tuple[torch.Tensor, torch.Tensor] | None = None  # (x, tanh(x)) of the last rsample

    @property
    def mean(self) -> torch.Tensor:
        return torch.tanh(self.loc)

    def sample(self) -> torch.Tensor:
        """An action without gradient: tanh of a draw of N(mu, sigma)."""
        with torch.no_grad():  # torch.normal(loc, scale)'s arithmetic, without its check of scale on the host
            eps = torch.empty(self.loc.shape, dtype=self.loc.dtype, device=self.loc.device).normal_()
            return eps.mul_(self.scale).add_(self.loc).tanh()

    def rsample(self) -> torch.Tensor:
        """A reparameterised action tanh(mu + sigma * eps), eps ~ N(0, I): (B, |A|)."""
        eps = torch.empty(self.loc.shape, dtype=self.loc.dtype, device=self.loc.device).normal_()
        x = self.loc + eps * self.scale
        y = x.tanh()
        self._pre_tanh = (x, y)
        return y

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """Log-density of each action dimension: (B, |A|)."""
        if self._pre_tanh is not None and self._pre_tanh[1] is action:
            x = self._pre_tanh[0]
        else:
            x = torch.atanh(action)
        log_abs_det_jacobian = 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))
        normal = -((x - self.loc) ** 2) / (2 * self.scale**2) - self.scale.log() - math.log(math.sqrt(2 * math.pi))
        return (0.0 - log_abs_det_jacobian) + normal


class Actor(nn.Module):
    """Trunk Linear(repr -> 50) + LayerNorm, then an MLP to the tanh-Gaussian's mean and log-std."""

    def __init__(self, repr_dim: int, action_dim: int, feature_dim: int, hidden_dim: int, hidden_depth: int,
                 log_std_bounds: tuple[float, float]):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(repr_dim, feature_dim), nn.LayerNorm(feature_dim))
        self.policy = mlp(feature_dim, hidden_dim, 2 * action_dim, hidden_depth)
        self.log_std_bounds = log_std_bounds
        self.apply(orthogonal_init)

    def forward(self, features: torch.Tensor) -> SquashedNormal:
        mu, log_std = self.policy(self.trunk(features)).chunk(2, dim=-1)
        low, high = self.log_std_bounds
        log_std = low + 0.5 * (high - low) * (torch.tanh(log_std) + 1)  # squash into [low, high]
        return SquashedNormal(mu, log_std.exp())


class Critic(nn.Module):
    """Clipped double Q: a shared trunk Linear(repr -> 50) + LayerNorm, then two Q MLPs on [h, a]."""

    def __init__(self, repr_dim: int, action_dim: int, feature_dim: int, hidden_dim: int, hidden_depth: int):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(repr_dim, feature_dim), nn.LayerNorm(feature_dim))
        self.q1 = mlp(feature_dim + action_dim, hidden_dim, 1, hidden_depth)
        self.q2 = mlp(feature_dim + action_dim, hidden_dim, 1, hidden_depth)
        self.apply(orthogonal_init)

    def forward(self, features: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.cat([self.trunk(features), action], dim=-1)
        return self.q1(h), self.q2(h)


@torch.no_grad()
def soft_update(online: nn.Module, target: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target, for every parameter."""
    targets, sources = list(target.parameters()), list(online.parameters())
    if len(targets) != len(sources):
        raise ValueError(f"target has {len(targets)} parameters, online {len(sources)}")
    for target_param, source in zip(targets, sources, strict=True):
        target_param.lerp_(source, tau)


def log_prob_sum(dist: SquashedNormal, action: torch.Tensor) -> torch.Tensor:
    """Log-probability of each action vector: (B, |A|) -> (B, 1)."""
    return dist.log_prob(action).sum(-1, keepdim=True)
