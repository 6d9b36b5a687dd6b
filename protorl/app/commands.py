"""What protorl-pretrain, protorl-finetune and protorl-train do, as Python functions.

    import protorl
    from protorl.agents.proto.agent import ProtoConfig
    results = protorl.train(task="point_mass_maze_reach_top_left", pretrain_task="point_mass_maze_explore",
                            env={"obs": "states"}, pretrain_frames=30_000, finetune_frames=10_000,
                            agent=ProtoConfig(batch_size=32), run_dir="runs/mine")

They take the typed `Config` (or its fields as keywords: a group as its dataclass, e.g. `EnvConfig(obs="states")`,
or a dict of the keys it changes), check it as the commands do, keep the run directory's
contract (a rerun continues or skips what is there; other settings are refused) and return the phases'
`PhaseResult`s. A user error raises a `protorl.errors.ProtorlError` naming what to change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from pathlib import Path

from omegaconf import OmegaConf

from protorl.app.plan import RunPlan, configured, plan_run
from protorl.config import Config, ConfigError
from protorl.logs.tracking import finish_run, phase_tracker, start_run
from protorl.storage.atomic import write_text_atomic
from protorl.storage.checkpoints import drop_checkpoints
from protorl.storage.run_files import CONFIG_FILE
from protorl.storage.rundir import claim_run_dir, release_run_dir, run_settings
from protorl.storage.snapshots import load_snapshot
from protorl.training import PhaseResult, Trainer, prepare_process
from protorl.training.phases import PlannedPhase

log = logging.getLogger("protorl")


def pretrain(config: Config | None = None, **fields) -> list[PhaseResult]:
    """Task-agnostic pre-training (`protorl-pretrain`); its snapshots are in the result's `snapshots`."""
    return run_command(configured(config, fields), "pretrain", named=list(fields))


def finetune(config: Config | None = None, **fields) -> list[PhaseResult]:
    """Downstream RL from `snapshot` on `task` (or each of `finetune_tasks`) (`protorl-finetune`)."""
    return run_command(configured(config, fields), "finetune", named=list(fields))


def train(config: Config | None = None, **fields) -> list[PhaseResult]:
    """Pre-training, then fine-tuning from its last snapshot (`protorl-train`)."""
    return run_command(configured(config, fields), "train", named=list(fields))


# A run seeds and draws from the process-wide generators of torch, NumPy and Python: two runs in one process at once
# would draw from each other's streams, so a second is refused (run them in separate processes).
_one_run_per_process = threading.Lock()


def run_command(config: Config, command: str, named: Collection[str] = ()) -> list[PhaseResult]:
    """Plan `command` with `config` (`protorl.app.plan.plan_run`) and run the plan; one run at a time per process
    (`ConfigError` for a second one started meanwhile, e.g. from another thread). `named`: the keys the caller set
    (`protorl.app.plan.check_named_task`)."""
    if not _one_run_per_process.acquire(blocking=False):
        raise ConfigError("another protorl run is in progress in this process: runs draw from the process-wide "
                          "random generators of torch, NumPy and Python, so two at once would not give either's "
                          "results; run them one after the other, or in separate processes")
    try:
        return run_plan(plan_run(config, command, named))
    finally:
        _one_run_per_process.release()


def run_plan(plan: RunPlan) -> list[PhaseResult]:
    """Claim the plan's run directory, run its phases in it (its `config.yaml` written first if new), release it."""
    config = plan.config
    run_dir = claim_run_dir(config)
    try:
        if not (run_dir / CONFIG_FILE).exists():  # a continued run keeps the record it was made with
            write_text_atomic(run_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.structured(config)))
        device = prepare_process(config.runtime)
        log.info("run directory %s, device %s", run_dir, device)
        wandb_run = start_run(config.logging, run_dir, OmegaConf.to_container(OmegaConf.structured(config)))
        modes = {phase.mode for phase in plan.phases}
        if plan.command == "train" and "frozen" not in modes:
            log.info("no pre-training (agent=%s, pretrain_frames=%d): the downstream agent learns its representation "
                     "by its own rule while it learns the task", config.agent.name, config.pretrain_frames)
        if "frozen" in modes and config.compare_without_pretraining and "online" not in modes:
            log.info("compare_without_pretraining: agent=%s has no mode without pre-training; skipped",
                     config.agent.name)
        results, pretrained = [], plan.pretrained
        try:
            for phase in plan.phases:
                if phase.mode == "frozen" and pretrained is None:  # the pre-training's last snapshot, just written
                    pretrained = load_snapshot(results[-1].snapshots[-1])
                start = pretrained if phase.mode == "frozen" else None
                results.append(run_phase(config, phase, run_dir / phase.dir_name, start, wandb_run))
        finally:
            finish_run(wandb_run)
        return results
    finally:
        release_run_dir(run_dir)


def run_phase(config: Config, phase: PlannedPhase, out_dir: Path, pretrained: dict | None = None,
              wandb_run=None) -> PhaseResult:
    """Run one phase: skip it if complete, else continue from its newest intact checkpoint or start it; its logs
    also go to `wandb_run` if given.

    `claim_run_dir` has made sure that what `out_dir` holds was made with these settings."""
    done = PhaseResult.load(out_dir, run_settings(config))
    if done is not None:
        log.info("%s already complete in %s", phase.phase, out_dir)
        if not config.checkpoints.keep_completed:  # a kill between result.json and the clean-up left them
            drop_checkpoints(out_dir / "checkpoints")
        return done
    trainer = Trainer(config, phase, out_dir, pretrained, phase_tracker(wandb_run, out_dir.name))
    checkpoint = trainer.resume_or_start()
    if checkpoint is not None:
        log.info("resuming %s from %s (frame %d)", phase.phase, checkpoint, trainer.frames)
    return trainer.run()
