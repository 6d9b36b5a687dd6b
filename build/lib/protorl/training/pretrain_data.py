"""Fine-tuning on the pre-training's data, a departure from the paper (docs/finetuning.md).

A snapshot written with `snapshots.with_replay=true` holds the pre-training's replay buffer and each frame's physical
state. Downstream, its rewards are relabelled with the task's: a transition that ended in physical state s after
action a is worth `action_repeat * reward(s, a)`, the task's reward of one control step ending in s, repeated for
the agent step's `action_repeat` control steps (whose intermediate states the replay does not keep). Every update
then draws `replay.pretrain_data_share` of its batch from that buffer and the rest from the fine-tuning's own replay.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from protorl.envs import Simulated
from protorl.replay import Batch, ReplayBuffer


def relabelled_replay(state: dict, env: Simulated, action_repeat: int, seed: int | list[int]) -> ReplayBuffer:
    """The pre-training replay of `state` (`ReplayBuffer.state_dict()` with physical states) with the rewards of
    `env`'s task; `env`'s physics is moved around (use one of its own). Its sampling draws from `seed`."""
    arrays = state["arrays"]
    frames, physical_states = arrays["frames"].numpy(), arrays["physical_states"].numpy()
    replay = ReplayBuffer(frames.shape[1:], frames.dtype, arrays["actions"].shape[1:], capacity=len(frames),
                          frame_stack=env.frame_stack, seed=seed, physical_state_shape=physical_states.shape[1:])
    replay.load_state_dict(state)
    replay.reseed(seed)
    for slot in np.flatnonzero(~replay.is_first[: len(frames)]):
        replay.rewards[slot] = action_repeat * env.reward_at(physical_states[slot], replay.actions[slot])
    return replay


def mixed_batch(online: ReplayBuffer, pretrain_data: ReplayBuffer, batch_size: int, share: float,
                device: torch.device) -> Batch:
    """`batch_size` transitions: round(share * batch_size) from `pretrain_data`, the rest from `online`, in that
    order (online first)."""
    from_pretraining = round(share * batch_size)
    parts = [online.sample(batch_size - from_pretraining, device), pretrain_data.sample(from_pretraining, device)]
    return Batch(*(torch.cat([getattr(part, field.name) for part in parts]) for field in dataclasses.fields(Batch)))
