"""A run's plan: its settings checked once, before anything is written, and what it will run.

Every way into a run makes its plan here and nowhere else: the Hydra commands (before Hydra writes into the run
directory), each job of a sweep (before the first one starts) and the Python API (`protorl.train` and the others).
`plan_run` asks every rule once, in order:

1. the settings: keys the schema knows (`typed_config` for the command line's, `configured` for Python's), each
   value on its own (each group's `check()`, the agent's) and together (`protorl.app.validate`);
2. the snapshot a fine-tuning starts from: found (`pretrain_sweep`), read, verified against its digest and matched
   to the task's environment;
3. the run directory: empty, or holding this run (`protorl.storage.rundir.check_run_dir`);
4. on the machine that runs it: its replay's memory and its wall time (`protorl.app.preflight`).

The `RunPlan` it returns holds the checked config, the phases in order (what the Trainer runs), the snapshot read and
the wall time estimated; `protorl.app.commands.run_plan` runs it.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import typing
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import MISSING, DictConfig, OmegaConf

from protorl.agents import agent_config
from protorl.app.preflight import preflight
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
from protorl.storage.rundir import check_run_dir
from protorl.storage.snapshots import check_spec, load_snapshot, snapshot_digest, snapshot_in_sweep
from protorl.training.phases import PlannedPhase, planned_phases

COMMANDS = ("pretrain", "finetune", "train")


@dataclass(frozen=True)
class RunPlan:
    """A run, checked: what `protorl.app.commands.run_plan` runs."""

    command: str  # one of `COMMANDS`
    # `snapshot` absolute (with `pretrain_sweep`: the sweep's matching snapshot), `snapshot_sha256` its digest, `agent`
    # of its agent's own config class: as the run directory records it
    config: Config
    phases: tuple[PlannedPhase, ...]  # in the order they run
    pretrained: dict | None  # the snapshot a fine-tuning starts from, read and verified (`load_snapshot`)
    seconds: float | None  # the wall time estimated; None for a run too short to time, or not planned on the
    # run's machine


def plan_run(config: Config, command: str, named: Collection[str] = (), on_this_machine: bool = True) -> RunPlan:
    """The plan of running `command` with `config`; `ConfigError` (or another `ProtorlError`) naming the first rule
    it breaks. `named`: the keys the user set (`validate.check_named_task`). `on_this_machine`: this machine runs it,
    so its pre-flight runs too (a sweep checks its jobs before any starts without them: each job
    checks them when it starts, where it runs)."""
    if command not in COMMANDS:
        raise ValueError(f"command={command!r}: one of {', '.join(COMMANDS)}")
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
    check_run_dir(config)
    phases = tuple(planned_phases(config, command, pretrained is not None))
    seconds = preflight(config, phases, pretrained) if on_this_machine else None
    return RunPlan(command, config, phases, pretrained, seconds)


def recorded_snapshot(config: Config, pretrained: dict | None) -> Config:
    """`config` with `snapshot_sha256` set to its snapshot's digest (`pretrained`'s, if read already; None for a
    missing file), and `ConfigError` if a `snapshot_sha256` given is another one."""
    path = Path(config.snapshot)
    digest = pretrained["sha256"] if pretrained is not None else snapshot_digest(path) if path.is_file() else None
    if config.snapshot_sha256 is not None and digest is not None and digest != config.snapshot_sha256:
        raise ConfigError(f"snapshot={path} has digest {digest}, not the snapshot_sha256 given "
                          f"({config.snapshot_sha256})")
    return dataclasses.replace(config, snapshot_sha256=digest)


def typed_config(settings: DictConfig) -> Config:
    """The typed config of the settings Hydra composed (without Hydra's own node); `ConfigError` for a key the
    schema does not know (one added with `+`), which the typed config would otherwise drop silently."""
    unknown = _unknown_keys(settings, Config)
    if unknown:
        raise ConfigError(unknown_key_message(unknown))
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), settings))


def named_keys(overrides: Sequence[str]) -> list[str]:
    """The keys a command line's overrides set (`task=x`, `+a.b=1`, `~c`: task, a.b, c)."""
    return [override.split("=", 1)[0].lstrip("+~") for override in overrides]


def configured(config: Config | None, fields: dict) -> Config:
    """A copy of `config` (default: the paper's `Config()`) with `fields` replaced, as the Python API takes its
    settings; `ConfigError` for a field `Config` does not have, a value of the wrong type, no `run_dir`, or a
    `config` that is not a `Config`."""
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
    config = dataclasses.replace(config, **{key: _group(config, key, _plain(value)) for key, value in fields.items()})
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
    return dataclasses.replace(group, **{name: _plain(item) for name, item in value.items()})


def _plain(value):
    """A value as the config holds it: a path (`pathlib.Path`) as its string, a NumPy or other integer or real
    number as Python's, a list or tuple item by item; anything else as it is."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, int):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def _unknown_keys(node: DictConfig, schema: type, prefix: str = "") -> list[str]:
    """Dotted keys of `node` that the dataclass `schema` (nested dataclasses included) does not have."""
    fields, unknown = typing.get_type_hints(schema), []
    for key in node.keys():
        if key not in fields:
            unknown.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(fields[key]) and OmegaConf.is_dict(node[key]):
            child_schema = OmegaConf.get_type(node[key])  # the agent's own config class, a subclass of the field's
            child_schema = child_schema if dataclasses.is_dataclass(child_schema) else fields[key]
            unknown += _unknown_keys(node[key], child_schema, f"{prefix}{key}.")
    return unknown
