"""Pre-training snapshots on a schedule: at each of `snapshots.at_frames` and at the end of the phase."""

from __future__ import annotations

from protorl.agents import Agent
from protorl.config import SnapshotsConfig
from protorl.envs import Env
from protorl.replay import ReplayBuffer
from protorl.storage.snapshots import save_snapshot
from protorl.training.callbacks import Callback
from protorl.training.context import PhaseContext
from protorl.training.result import PhaseResult


class Snapshots(Callback):
    """Writes the agent's representation to snapshots/snapshot_<frames>.pt (pre-training only), with the replay
    buffer if `snapshots.with_replay`, and lists it in the result."""

    def __init__(self, cfg: SnapshotsConfig, settings: dict, context: PhaseContext, total_frames: int, env: Env,
                 agent: Agent, replay: ReplayBuffer, result: PhaseResult):
        """`settings`: the run's settings as plain data (its config), recorded in each snapshot."""
        self.cfg, self.settings, self.context = cfg, settings, context
        self.env, self.agent, self.replay, self.result = env, agent, replay, result
        self.takes_snapshots = result.phase == "pretrain"
        self.pending_frames = sorted(f for f in cfg.at_frames if f < total_frames)

    def before_step(self, frames: int) -> None:
        if self.takes_snapshots and self.pending_frames and frames >= self.pending_frames[0]:
            self.pending_frames.pop(0)
            self.save(frames)

    def on_phase_end(self, frames: int) -> None:
        if self.takes_snapshots:
            self.save(frames)

    def save(self, frames: int) -> None:
        self.context.check_finite(frames)
        path = save_snapshot(self.result.out_dir / "snapshots" / f"snapshot_{frames}.pt",
                             self.agent.snapshot_state(), self.env.spec(), self.settings, frames,
                             replay=self.replay.state_dict() if self.cfg.with_replay else None)
        self.result.snapshots.append(path)

    def state_dict(self) -> dict:
        return {"pending_snapshot_frames": list(self.pending_frames)}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.pending_frames = list(checkpoint["pending_snapshot_frames"])
