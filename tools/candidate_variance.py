"""How the batch size that Proto-RL draws its candidates from sets the spread of the k-NN reward (figure 10).

For a Proto-RL snapshot that holds its replay (`snapshots.with_replay=true`, as the main job's do), the k-NN reward of
64 probe observations is recomputed 10 times with freshly drawn candidate sets (`protorl.exploration.reward_variance`)
while the batch the prototype-balanced candidates come from takes several sizes; the representation is the
snapshot's throughout. Prints, per reward space and batch size, the mean coefficient of variation of the reward
under the prototype-balanced candidates and under uniform ones, and how many distinct observations one
prototype-balanced queue holds (it draws one candidate per prototype from each of T batches):

    python tools/candidate_variance.py runs/<date>/<time>_train_<task>_seed1/pretrain/snapshots/snapshot_30000.pt
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch
from omegaconf import OmegaConf

from protorl.agents import make_agent
from protorl.agents.proto.agent import ProtoConfig
from protorl.exploration.reward_variance import proto_candidates, reward_variance
from protorl.replay import ReplayBuffer
from protorl.storage.snapshots import load_snapshot

PROBES, REPEATS = 64, 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", help="a Proto-RL snapshot from states that holds its replay")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 512, 2048])
    parser.add_argument("--reward-spaces", nargs="+", default=["raw", "sphere"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    snapshot = load_snapshot(args.snapshot)
    if "replay" not in snapshot:
        parser.error(f"{args.snapshot} holds no replay: pre-train with snapshots.with_replay=true")
    config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ProtoConfig), snapshot["config"]["agent"]))
    replay = _replay(snapshot["replay"])
    probes = replay.stack_at(replay.sample_indices(PROBES, np.random.default_rng(0)))
    print(f"{args.snapshot}: M={config.num_prototypes} prototypes, T={config.candidates_per_prototype} batches per "
          f"queue, k={config.knn_k}, {PROBES} probes, {REPEATS} candidate sets each")
    print("| reward space | batch | proto cv | uniform cv | proto / uniform | distinct observations in a queue |")
    print("|---|---|---|---|---|---|")
    for space in args.reward_spaces:
        for batch in args.batch_sizes:
            agent = _agent(snapshot, dataclasses.replace(config, batch_size=batch, reward_space=space), replay)
            spread = reward_variance(agent, replay, probes, REPEATS, np.random.default_rng(1),
                                     torch.Generator().manual_seed(0))
            queue = proto_candidates(agent, replay, np.random.default_rng(2), torch.Generator().manual_seed(1))
            proto, uniform = spread["variance/proto_cv"], spread["variance/uniform_cv"]
            print(f"| {space} | {batch} | {proto:.3f} | {uniform:.3f} | {proto / uniform:.2f} | "
                  f"{torch.unique(queue, dim=0).shape[0]} of {queue.shape[0]} |")


def _replay(state: dict) -> ReplayBuffer:
    arrays = state["arrays"]
    replay = ReplayBuffer(arrays["frames"].shape[1:], arrays["frames"].numpy().dtype, arrays["actions"].shape[1:],
                          capacity=len(arrays["frames"]), frame_stack=1,
                          physical_state_shape=arrays["physical_states"].shape[1:])
    replay.load_state_dict(state)
    return replay


def _agent(snapshot: dict, config: ProtoConfig, replay: ReplayBuffer):
    """The snapshot's representation in a downstream agent of `config` (its batch and reward space)."""
    agent = make_agent(config, "states", replay.frames.shape[1:], replay.actions.shape[1:], torch.device("cpu"),
                       "frozen")
    agent.load_pretrained(snapshot["agent"])
    return agent


if __name__ == "__main__":
    main()
