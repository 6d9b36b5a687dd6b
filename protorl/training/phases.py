"""The phases a command runs, in order: decided once, by the run's plan, and handed to the Trainer."""

from __future__ import annotations

from dataclasses import dataclass

from protorl.agents import agent_class, pretrains
from protorl.config import Config, downstream_tasks
from protorl.storage.run_files import PRETRAIN_DIR, downstream_dir_name, scratch_dir_name


@dataclass(frozen=True)
class PlannedPhase:
    """One phase of a run: what it is, on which task, for how many frames, in which folder of the run directory."""

    kind: str  # "pretrain"; "finetune": from the pre-trained snapshot; "scratch": without pre-training
    task: str
    dir_name: str  # in the run directory
    frames: int  # env frames

    @property
    def phase(self) -> str:
        """What the trainer and the phase's result call it: "pretrain" or "finetune" (with or without a snapshot)."""
        return "pretrain" if self.kind == "pretrain" else "finetune"

    @property
    def agent_mode(self) -> str:
        """The mode the phase's agent is made in (`protorl.agents.MODES`)."""
        return {"pretrain": "pretrain", "finetune": "frozen", "scratch": "online"}[self.kind]


def planned_phases(cfg: Config, command: str, snapshot_given: bool) -> list[PlannedPhase]:
    """The phases `command` runs with `cfg`; `snapshot_given`: protorl-finetune's `snapshot` (or `pretrain_sweep`)
    has been loaded. A fine-tuning starts from that snapshot or from the one its own pre-training writes."""
    phases = []
    if command == "pretrain" or (command == "train" and pretrains(cfg)):
        phases.append(PlannedPhase("pretrain", cfg.pretrain_task or cfg.task, PRETRAIN_DIR, cfg.pretrain_frames))
    if command in ("finetune", "train"):
        has_snapshot = snapshot_given or bool(phases)
        kind = "finetune" if has_snapshot else "scratch"  # without a snapshot, the downstream agent learns it all
        phases += [PlannedPhase(kind, task, downstream_dir_name(cfg, task), cfg.finetune_frames)
                   for task in downstream_tasks(cfg)]
        if has_snapshot and compares_without_pretraining(cfg):
            phases += [PlannedPhase("scratch", task, scratch_dir_name(task), cfg.finetune_frames)
                       for task in downstream_tasks(cfg)]
    return phases


def phase_of(cfg: Config, kind: str, task: str | None = None) -> PlannedPhase:
    """A phase of `kind` ("pretrain", "finetune" or "scratch") on `task` with the frames of `cfg`, for a Trainer built
    by hand (default task: the pre-training's, or the downstream `task`)."""
    task = task or (cfg.pretrain_task or cfg.task if kind == "pretrain" else cfg.task)
    frames = cfg.pretrain_frames if kind == "pretrain" else cfg.finetune_frames
    dir_name = {"pretrain": PRETRAIN_DIR, "finetune": downstream_dir_name(cfg, task),
                "scratch": scratch_dir_name(task)}[kind]
    return PlannedPhase(kind, task, dir_name, frames)


def compares_without_pretraining(cfg: Config) -> bool:
    """Whether a fine-tuning from a snapshot is followed by the same fine-tuning without pre-training: asked for
    (`compare_without_pretraining`) and possible (the agent has a mode without pre-training)."""
    return cfg.compare_without_pretraining and agent_class(cfg.agent.name).supports("online")
