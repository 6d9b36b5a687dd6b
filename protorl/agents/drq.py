"""DrQ (Kostrikov et al. 2020): SAC from pixels with random shifts; the critic loss trains the encoder.

The paper's supervised reference line: it learns from the task reward from the first frame, so it has
no pre-training phase ("online" only). One augmented view per observation (DrQ's K = M = 1) and critic
targets from the online encoder without gradient (as in DrQ-v2), with the SAC core and encoder shared by
every agent.
"""

from __future__ import annotations

from protorl.agents.base import EncoderTrainedByCritic, Metrics, critic_through_encoder
from protorl.agents.sac import UpdateParts
from protorl.replay import Batch


class DrQAgent(EncoderTrainedByCritic):
    """DrQ (Kostrikov et al. 2020): SAC on the task reward from the first frame, the critic's loss training the
    encoder; it has no task-agnostic phase."""

    name = "drq"
    title = "DrQ"

    @classmethod
    def method_title(cls, obs_type: str) -> str:
        """From states there is no image to augment: DrQ is SAC learning from the task reward alone."""
        return "SAC from scratch" if obs_type == "states" else cls.title

    def update_online(self, batch: Batch, parts: UpdateParts) -> Metrics:
        obs, next_obs = self.augmented(batch)
        metrics = critic_through_encoder(self.encoder, self.sac, obs, batch.action, batch.reward, batch.discount,
                                         next_obs, parts, self.encoder_optimizer)
        metrics["extr_reward_mean"] = batch.reward.mean()
        return metrics
