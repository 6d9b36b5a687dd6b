"""Sweeps that share pre-training: fine-tunings that take their snapshot from a pre-training sweep.

Figures 6 and 7 vary only what happens downstream (which snapshot; alpha), so their pre-training runs once per
(agent, task, seed) in a `protorl-pretrain -m` sweep, and a `protorl-finetune -m` sweep with
`pretrain_sweep=<that sweep's directory>` starts each fine-tuning from the snapshot of the matching run at
`pretrain_frames` (README, "Sweeps that share pre-training").
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from protorl.errors import SnapshotError


def snapshot_in_sweep(sweep_dir: str | Path, agent: str, pretrain_task: str, seed: int, frames: int) -> Path:
    """The snapshot at `frames` of the run in `sweep_dir` (a directory of run directories) that pre-trained
    `agent` on `pretrain_task` with `seed`; `SnapshotError` naming what is missing otherwise."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SnapshotError(f"pretrain_sweep={sweep_dir}: no such directory")
    for config_file in sorted(sweep_dir.glob("*/config.yaml")):
        run = OmegaConf.load(config_file)
        if (run.agent.name, run.pretrain_env or run.env, run.seed) == (agent, pretrain_task, seed):
            snapshot = config_file.parent / "pretrain" / "snapshots" / f"snapshot_{frames}.pt"
            if not snapshot.is_file():
                raise SnapshotError(f"pretrain_sweep={sweep_dir}: run {config_file.parent.name} has no snapshot "
                                    f"at pretrain_frames={frames} ({snapshot.name} is missing: unfinished, or not "
                                    "in its snapshot_at_frames)")
            return snapshot
    raise SnapshotError(f"pretrain_sweep={sweep_dir}: no run pre-trained agent {agent} on {pretrain_task} with "
                        f"seed {seed}")
