"""Random exploration (appendix C.4): a uniform-random policy collects the task-agnostic data, on which
DrQ pre-trains the convolutional encoder; downstream, a fresh SAC agent learns on the frozen encoder.

The paper does not say what reward DrQ optimises on task-agnostic data. We read "used by DrQ to
pre-train the encoder" literally: DrQ's update (critic loss through the encoder, random shifts) with
reward 0, so the encoder is shaped only by the soft Q-target's entropy term and the augmentation. The
SAC policy learns from the same update but never acts: exploration stays uniformly random.
"""

from __future__ import annotations

import numpy as np
import torch

from protorl.agents.base import EncoderTrainedByCritic, Metrics, critic_through_encoder
from protorl.agents.sac import UpdateParts
from protorl.replay import Batch


class RandomAgent(EncoderTrainedByCritic):
    """Random (appendix C.4): uniform-random actions in pre-training, while DrQ's critic loss on reward 0 trains
    the encoder."""

    name = "random"
    title = "Random"

    def act(self, obs: np.ndarray, sample: bool) -> np.ndarray:
        """Pre-training samples uniform actions in [-1, 1] (torch's RNG, so checkpoints resume exactly)."""
        if self.mode == "pretrain" and sample:
            return (2 * torch.rand(self.action_shape) - 1).numpy()
        return super().act(obs, sample)

    def update_pretrain(self, batch: Batch, parts: UpdateParts) -> Metrics:
        obs, next_obs = self.augmented(batch)
        no_reward = torch.zeros_like(batch.discount)  # (B, 1)
        return critic_through_encoder(self.encoder, self.sac, obs, batch.action, no_reward, batch.discount,
                                      next_obs, parts, self.encoder_optimizer)
