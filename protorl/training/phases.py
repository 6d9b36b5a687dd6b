"""The phases a command runs, in order: decided once, by the run's plan, and handed to the Trainer."""

from __future__ import annotations

from dataclasses import dataclass

from protorl.agents import agent_class, pretrains
from protorl.config import Config
from protorl.storage.run_files import PRETRAIN_DIR, downstream_dir_name, scratch_dir_name


@dataclass(frozen=True)
class PlannedPhase:
    """One phase of a run: the mode its agent learns in, on which task, for how many frames, in which folder of the
    run directory."""

    mode: str  # `protorl.agents.MODES`: "pretrain"; "frozen": downstream from the snapshot; "online": without one
    task: str
    dir_name: str  # in the run directory
    frames: int  # env frames

    @property
    def phase(self) -> str:
        """The protocol's phase, as the trainer and the phase's result name it: "pretrain" or "finetune" (from a
        snapshot or not)."""
        return "pretrain" if self.mode == "pretrain" else "finetune"


def planned_phases(config: Config, command: str, snapshot_given: bool) -> list[PlannedPhase]:
    """The phases `command` runs with `config`; `snapshot_given`: protorl-finetune's `snapshot` (or `pretrain_sweep`)
    has been loaded. A fine-tuning starts from that snapshot or from the one its own pre-training writes."""
    phases = []
    if command == "pretrain" or (command == "train" and pretrains(config)):
        phases.append(PlannedPhase("pretrain", config.pretrain_task or config.task, PRETRAIN_DIR,
                                   config.pretrain_frames))
    if command in ("finetune", "train"):
        has_snapshot = snapshot_given or bool(phases)
        mode = "frozen" if has_snapshot else "online"  # without a snapshot, the downstream agent learns it all
        phases += [PlannedPhase(mode, task, downstream_dir_name(config, task), config.finetune_frames)
                   for task in config.downstream_tasks]
        # the comparison without pre-training: asked for, and possible (the agent has a mode without pre-training)
        if has_snapshot and config.compare_without_pretraining and agent_class(config.agent.name).supports("online"):
            phases += [PlannedPhase("online", task, scratch_dir_name(task), config.finetune_frames)
                       for task in config.downstream_tasks]
    return phases


def phase_of(config: Config, mode: str, task: str | None = None) -> PlannedPhase:
    """A phase whose agent learns in `mode` ("pretrain", "frozen" or "online") on `task` with the frames of
    `config`, for a Trainer built by hand (default task: the pre-training's, or the downstream `task`)."""
    task = task or (config.pretrain_task or config.task if mode == "pretrain" else config.task)
    frames = config.pretrain_frames if mode == "pretrain" else config.finetune_frames
    dir_name = {"pretrain": PRETRAIN_DIR, "frozen": downstream_dir_name(config, task),
                "online": scratch_dir_name(task)}[mode]
    return PlannedPhase(mode, task, dir_name, frames)
