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

from protorl.agents.drq import DrQAgent


class RandomAgent(DrQAgent):
    name = "random"
    pretrains = True
    learns_online = False

    def act(self, obs: np.ndarray, sample: bool) -> np.ndarray:
        """Pre-training samples uniform actions in [-1, 1] (torch's RNG, so checkpoints resume exactly)."""
        if self.phase == "pretrain" and sample:
            return (2 * torch.rand(self.action_shape) - 1).numpy()
        return super().act(obs, sample)

    def update_pretrain(self, obs, action, discount, next_obs, step: int) -> dict[str, float]:
        no_reward = torch.zeros_like(discount)  # (B, 1)
        return self.update_sac_through_encoder(obs, action, no_reward, discount, next_obs, step,
                                               self.encoder_optimizer)
