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

import dataclasses
import logging
import threading
from collections.abc import Collection
from pathlib import Path

from omegaconf import MISSING, OmegaConf

from protorl.agents import agent_config
from protorl.app.duration import check_duration
from protorl.app.phases import compares_without_pretraining, planned_phases
from protorl.app.resources import check_memory
from protorl.app.validate import check_named_task, validate
from protorl.config import (
    GROUPS,
    RENAMED,
    Config,
    ConfigError,
    downstream_tasks,
    invalid,
    renamed_message,
    type_errors,
    unknown_key_message,
)
from protorl.envs import make_env
from protorl.logs.tracking import finish_run, phase_tracker, start_run
from protorl.storage.atomic import write_text_atomic
from protorl.storage.checkpoints import drop_checkpoints
from protorl.storage.run_files import CONFIG_FILE
from protorl.storage.rundir import claim_run_dir, release_run_dir
from protorl.storage.snapshots import check_spec, load_snapshot, snapshot_digest, snapshot_in_sweep
from protorl.training import PhaseResult, Trainer, prepare_process

log = logging.getLogger("protorl")
COMMANDS = ("pretrain", "finetune", "train")


def pretrain(config: Config | None = None, **fields) -> list[PhaseResult]:
    """Task-agnostic pre-training (`protorl-pretrain`); its snapshots are in the result's `snapshots`."""
    return run_command(configured(config, fields), "pretrain", named=list(fields))


def finetune(config: Config | None = None, **fields) -> list[PhaseResult]:
    """Downstream RL from `snapshot` on `task` (or each of `finetune_tasks`) (`protorl-finetune`)."""
    return run_command(configured(config, fields), "finetune", named=list(fields))


def train(config: Config | None = None, **fields) -> list[PhaseResult]:
    """Pre-training, then fine-tuning from its last snapshot (`protorl-train`)."""
    return run_command(configured(config, fields), "train", named=list(fields))


def configured(config: Config | None, fields: dict) -> Config:
    """A copy of `config` (default: the paper's `Config()`) with `fields` replaced; `ConfigError` for a field
    `Config` does not have, without a `run_dir`, or for a `config` that is not a `Config`."""
    if config is not None and not isinstance(config, Config):
        raise ConfigError(f"config={config!r}: expected a protorl.config.Config, or none with the settings as "
                          "keywords (e.g. task=..., run_dir=...)")
    config = config or Config()
    for key, value in fields.items():  # `env` is a group now; the flat config's `env` was the task, a string
        if key in RENAMED and (key != "env" or isinstance(value, str)):
            raise ConfigError(renamed_message(key))
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(Config)})
    if unknown:
        raise ConfigError(unknown_key_message(unknown))
    config = dataclasses.replace(config, **{key: _group(config, key, value) for key, value in fields.items()})
    for key, value, expected in type_errors(config):
        raise invalid(key, value, expected)
    if config.run_dir is MISSING:
        raise ConfigError("run_dir is required: the directory the run writes into (or continues)")
    return config


def _group(config: Config, key: str, value):
    """`value` for the field `key` of `config`: a dict given for a group changes those keys of the group's
    current settings (`ConfigError` for a key the group does not have, or for a group given as another group's
    class); anything else is taken as it is."""
    if key not in GROUPS:
        return value
    group = getattr(config, key)
    if not isinstance(value, dict | type(group)):
        raise ConfigError(f"{key}={value!r}: expected a protorl.config.{type(group).__name__} or a dict of its keys")
    if not isinstance(value, dict):
        return value
    unknown = sorted(set(value) - {f.name for f in dataclasses.fields(group)})
    if unknown:
        raise ConfigError(unknown_key_message([f"{key}.{name}" for name in unknown]))
    return dataclasses.replace(group, **value)


def check(config: Config, command: str, named: Collection[str] = (),
          resources: bool = True) -> tuple[Config, dict | None]:
    """`config` checked for `command` (one of `COMMANDS`) before anything is written, as a new config, and for
    finetune its snapshot, read and verified (`named`: the keys the user set, `validate.check_named_task`); with
    `resources`, also the memory the run will need (`resources.check_memory`) and its wall time on this machine
    (`duration.check_duration`). In the new config `snapshot` is
    absolute, so the run directory records where it came from (with `pretrain_sweep` instead, it is the sweep's
    matching snapshot), `snapshot_sha256` is the digest its pre-training wrote with it (`ConfigError` if one was
    given and differs), and `agent` is of its agent's own config class."""
    if command == "finetune" and config.pretrain_sweep and not config.snapshot:
        sweep = str(Path(config.pretrain_sweep).resolve())
        snapshot = snapshot_in_sweep(sweep, agent_config(config.agent).name, config.pretrain_task or config.task,
                                     config.seed, config.pretrain_frames)
        config = dataclasses.replace(config, pretrain_sweep=sweep, snapshot=str(snapshot))
    if config.snapshot:
        config = dataclasses.replace(config, snapshot=str(Path(config.snapshot).resolve()))
    validate(config, command)
    check_named_task(config, command, named)
    config = dataclasses.replace(config, agent=agent_config(config.agent))  # as the run directory records it
    pretrained = None
    if command == "finetune" and config.snapshot:  # refuse a missing, changed or mismatched snapshot before any work
        pretrained = load_snapshot(config.snapshot, agent_config=config.agent)
        for task in downstream_tasks(config):
            check_spec(Path(config.snapshot), pretrained["env_spec"], make_env(task, config.env, seed=0).spec())
        if config.replay.pretrain_data_share > 0 and "replay" not in pretrained:
            raise ConfigError(f"replay.pretrain_data_share={config.replay.pretrain_data_share}: snapshot "
                              f"{config.snapshot} holds no replay buffer; pre-train with snapshots.with_replay=true")
    if config.snapshot:
        config = recorded_snapshot(config, pretrained)
    if resources:
        check_memory(config, command, pretrained)
        check_duration(config, command, pretrained is not None)
    return config, pretrained


def recorded_snapshot(config: Config, pretrained: dict | None) -> Config:
    """`config` with `snapshot_sha256` set to its snapshot's digest (`pretrained`'s, if read already; None for a
    missing file), and `ConfigError` if a `snapshot_sha256` given is another one."""
    path = Path(config.snapshot)
    digest = pretrained["sha256"] if pretrained is not None else snapshot_digest(path) if path.is_file() else None
    if config.snapshot_sha256 is not None and digest is not None and digest != config.snapshot_sha256:
        raise ConfigError(f"snapshot={path} has digest {digest}, not the snapshot_sha256 given "
                          f"({config.snapshot_sha256})")
    return dataclasses.replace(config, snapshot_sha256=digest)


# A run seeds and draws from the process-wide generators of torch, NumPy and Python: two runs in one process at once
# would draw from each other's streams, so a second is refused (run them in separate processes).
_one_run_per_process = threading.Lock()


def run_command(config: Config, command: str, named: Collection[str] = ()) -> list[PhaseResult]:
    """Check `config`, claim its run directory, run the phases of `command` and release the directory; one run at a
    time per process (`ConfigError` for a second one started meanwhile, e.g. from another thread). `named`: the
    keys the caller set (`validate.check_named_task`)."""
    if not _one_run_per_process.acquire(blocking=False):
        raise ConfigError("another protorl run is in progress in this process: runs draw from the process-wide "
                          "random generators of torch, NumPy and Python, so two at once would not give either's "
                          "results; run them one after the other, or in separate processes")
    try:
        config, pretrained = check(config, command, named)
        return run_checked(config, command, pretrained)
    finally:
        _one_run_per_process.release()


def run_checked(config: Config, command: str, pretrained: dict | None) -> list[PhaseResult]:
    """Claim the run directory of a `check`ed config, run the phases of `command` in it, release it."""
    run_dir = claim_run_dir(config)
    try:
        return run_phases(config, command, run_dir, pretrained)
    finally:
        release_run_dir(run_dir)


def run_phases(config: Config, command: str, run_dir: Path, pretrained: dict | None) -> list[PhaseResult]:
    """The phases of `command` in the claimed `run_dir` (its `config.yaml` written first if new)."""
    if not (run_dir / CONFIG_FILE).exists():  # a continued run keeps the record it was made with
        write_text_atomic(run_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.structured(config)))
    device = prepare_process(config.runtime)
    log.info("run directory %s, device %s", run_dir, device)
    wandb_run = start_run(config.logging, run_dir, OmegaConf.to_container(OmegaConf.structured(config)))
    phases = planned_phases(config, command, pretrained is not None)
    from_snapshot = any(phase.kind == "finetune" for phase in phases)
    if command == "train" and not from_snapshot:
        log.info("no pre-training (agent=%s, pretrain_frames=%d): the downstream agent learns its "
                 "representation by its own rule while it learns the task", config.agent.name, config.pretrain_frames)
    if from_snapshot and config.compare_without_pretraining and not compares_without_pretraining(config):
        log.info("compare_without_pretraining: agent=%s has no mode without pre-training; skipped", config.agent.name)
    results = []
    try:
        for phase in phases:
            if phase.kind == "finetune" and pretrained is None:  # the pre-training's last snapshot, just written
                pretrained = load_snapshot(results[-1].snapshots[-1])
            start = pretrained if phase.kind == "finetune" else None
            results.append(run_phase(config, phase.phase, phase.task, run_dir / phase.dir_name, start, wandb_run))
    finally:
        finish_run(wandb_run)
    return results


def run_phase(config: Config, phase: str, task: str, out_dir: Path, pretrained: dict | None = None,
              wandb_run=None) -> PhaseResult:
    """Run one phase: skip it if complete, else continue from its newest intact checkpoint or start it; its logs
    also go to `wandb_run` if given.

    `claim_run_dir` has made sure that what `out_dir` holds was made with these settings."""
    done = PhaseResult.load(out_dir)
    if done is not None:
        log.info("%s already complete in %s", phase, out_dir)
        if not config.checkpoints.keep_completed:  # a kill between result.json and the clean-up left them
            drop_checkpoints(out_dir / "checkpoints")
        return done
    trainer = Trainer(config, phase, task, out_dir, pretrained, phase_tracker(wandb_run, out_dir.name))
    checkpoint = trainer.resume_or_start()
    if checkpoint is not None:
        log.info("resuming %s from %s (frame %d)", phase, checkpoint, trainer.frames)
    return trainer.run()
