"""A run's plan: its settings typed and checked once, before anything is written, and what it will run.

Every way into a run makes its plan here and nowhere else: the Hydra commands (before Hydra writes into the run
directory), each job of a sweep (before the first one starts) and the Python API (`protorl.train` and the others).
Both give their settings to `configured`, which types them as OmegaConf's structured config does (a key the schema
lacks or a value of another type refused, "3" taken as 3); `plan_run` then asks every rule once, in order:

1. each value on its own (each group's `check()`, the agent's) and together (`validate`);
2. the snapshot a fine-tuning starts from: found (`pretrain_sweep`), read, verified against its digest and matched
   to the task's environment;
3. the run directory: empty, or holding this run (`protorl.storage.rundir.check_run_dir`);
4. on the machine that runs it, the pre-flight: its replay's memory and its wall time (`protorl.app.preflight`).

The `RunPlan` it returns holds the checked config, the phases in order (what the Trainer runs), the snapshot read and
the wall time estimated; `protorl.app.commands.run_plan` runs it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from protorl.agents import Agent, agent_class, agent_config, pretrains, registered_agents
from protorl.app.preflight import preflight
from protorl.config import (
    EVAL_SEED_OFFSET,
    GROUPS,
    MAX_SEED,
    AgentConfig,
    Config,
    ConfigError,
    invalid,
    renamed_message,
    unknown_key_message,
)
from protorl.envs import Simulated, check_task, make_env, split_task
from protorl.envs.names import gymnasium_id
from protorl.logs.tracking import wandb_available
from protorl.runtime import device_problem
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
    it breaks. `named`: the keys the user set (`check_named_task`). `on_this_machine`: this machine runs it,
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
        pretrained = load_snapshot(config.snapshot, agent=config.agent)
        for task in config.downstream_tasks:
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


def configured(config: Config | None, fields: Mapping) -> Config:
    """`config` (default: the paper's `Config()`) with `fields` merged in (a group's dict changes those keys of it,
    a dataclass replaces it), typed as OmegaConf's structured config types the command line's values; `ConfigError`
    naming the first key it refuses (`config_error`), or no `run_dir`."""
    if config is not None and not isinstance(config, Config):
        raise ConfigError(f"config={config!r}: expected a protorl.config.Config, or none with the settings as "
                          "keywords (e.g. task=..., run_dir=...)")
    try:
        node = OmegaConf.structured(config or Config())
    except OmegaConfBaseException as error:
        raise ConfigError(config_error(error)) from None
    for key, value in fields.items():
        value = _plain(value)
        try:
            if key == "agent" and isinstance(value, Mapping):  # the agent's keys: those of its own config class
                name = value.get("name", node.agent.name)
                node.agent = (agent_config(OmegaConf.to_object(node.agent)) if name == node.agent.name
                              else agent_class(name).config_class())
            node = OmegaConf.merge(node, {key: value})
        except OmegaConfBaseException as error:
            raise ConfigError(config_error(error, key, value)) from None
    try:
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as error:
        raise ConfigError(config_error(error)) from None


def config_error(error: OmegaConfBaseException, key: str | None = None, value=None) -> str:
    """The line that refuses what OmegaConf refused (`key=value`: the setting it was merging): a renamed key, an
    unknown key, a missing value, a value of another type."""
    full_key = getattr(error, "full_key", None)
    renamed = renamed_message(full_key or key or "", value)
    if renamed:
        return renamed
    if key and full_key and full_key.split(".")[0] != key:  # a key of the dataclass given as `value`
        full_key = f"{key}.{full_key}"
    if isinstance(error, ConfigKeyError):
        return unknown_key_message([full_key or key])
    if isinstance(error, MissingMandatoryValue):
        return f"{full_key} is required" + (": the directory the run writes into (or continues)"
                                            if full_key == "run_dir" else "")
    message = " ".join(str(getattr(error, "msg", error)).split("full_key:")[0].split(". value:")[0].split())
    return f"invalid config value {full_key}: {message}" if full_key else \
        f"invalid config value {key}={value!r}: {message}"


def named_keys(overrides: Sequence[str]) -> list[str]:
    """The keys a command line's overrides set (`task=x`, `+a.b=1`, `~c`: task, a.b, c)."""
    return [override.split("=", 1)[0].lstrip("+~") for override in overrides]


def _plain(value):
    """A value as the config holds it: a path (`pathlib.Path`) as its string, a NumPy or other integer or real
    number as Python's, a list, tuple or dict item by item; anything else as it is."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, (int, bool)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


# the rules a run's settings obey, each asked once by `plan_run`

def validate(config: Config, command: str) -> None:
    """Raise `ConfigError` naming the first invalid value; called before anything is built or written.

    `command`: "pretrain", "finetune" or "train" (both phases).
    """
    _check_values(config)
    for group in GROUPS:
        getattr(config, group).check()
    agent = _check_agent(config, command)
    _check_process(config)
    _check_tasks(config, command, agent.supports("pretrain"))


def _check_values(config: Config) -> None:
    """Every float finite and every list's items values (OmegaConf lets a list hold lists and dicts), the agent's
    included; the seed and the fine-tuning's frames in range."""
    for prefix, node in (("", config), *((f"{group}.", getattr(config, group)) for group in (*GROUPS, "agent"))):
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise invalid(prefix + item.name, value, "a finite number")
            if isinstance(value, list) and any(isinstance(part, (list, dict)) for part in value):
                raise invalid(prefix + item.name, value, "a list of values, not of lists or dicts")
    if not 0 <= config.seed <= MAX_SEED:
        raise invalid("seed", config.seed, f"an integer in [0, {MAX_SEED}] (seeds are 32-bit; evaluation uses seed + "
                      f"{EVAL_SEED_OFFSET})")
    if config.finetune_frames <= 0:
        raise invalid("finetune_frames", config.finetune_frames, "a positive integer")


def _check_agent(config: Config, command: str) -> type[Agent]:
    """The agent, its own config, and whether it has the phases `command` runs."""
    agent = agent_class(config.agent.name)
    if type(config.agent) not in (agent.config_class, AgentConfig):
        raise invalid("agent.name", config.agent.name, f"the agent of the config chosen "
                      f"({type(config.agent).__name__}): set the agent with agent=NAME")
    agent_config(config.agent).check()
    if config.pretrain_frames < 0 or (command == "pretrain" and config.pretrain_frames == 0):
        raise invalid("pretrain_frames", config.pretrain_frames,
                      "a positive integer (0 only with protorl-train: no pre-training)")
    has_pretraining = agent.supports("pretrain")
    if command == "pretrain" and not has_pretraining:
        raise invalid("agent", agent.name, "an agent with a task-agnostic phase: DrQ learns from the task reward only "
                      "(run it with protorl-train or protorl-finetune)")
    if command == "train" and has_pretraining and config.pretrain_frames == 0 and not agent.supports("online"):
        raise invalid("pretrain_frames", 0, f"a positive integer: agent={agent.name} learns its representation only "
                      "in pre-training (agents without pre-training: "
                      f"{', '.join(name for name, a in registered_agents().items() if a.supports('online'))})")
    return agent


def _check_process(config: Config) -> None:
    """Tracking and the device: what this machine has."""
    if config.logging.wandb and not wandb_available():
        raise invalid("logging.wandb", True, "false, or install the wandb package first: pip install -e \".[wandb]\"")
    problem = device_problem(config.runtime.device)
    if problem is not None:
        raise invalid("runtime.device", config.runtime.device, problem)


def _check_tasks(config: Config, command: str, has_pretraining: bool) -> None:
    """The tasks exist, fit the replay and the frame budgets, share the pre-training's domain; fine-tuning has a
    snapshot."""
    tasks = [config.task, *([config.pretrain_task] if config.pretrain_task is not None else []), *config.finetune_tasks]
    for task in tasks:
        try:
            check_task(task)
        except ValueError as error:  # the environments' own error, as the user's
            raise ConfigError(str(error)) from None
    for task in dict.fromkeys(task for task in tasks if gymnasium_id(task) is not None):  # built and observed once
        try:
            env = make_env(task, config.env, seed=0)
            try:
                env.reset()  # from pixels, its renderer starts
            finally:
                env.close()
        except ValueError as error:
            raise ConfigError(str(error)) from None
    frame_stack = config.env.frame_stack if config.env.obs == "pixels" else 1
    if config.replay.capacity < frame_stack + config.agent.batch_size:
        raise invalid("replay.capacity", config.replay.capacity, f"at least the frame stack plus one batch "
                      f"({frame_stack} + agent.batch_size {config.agent.batch_size}): a transition needs its stacks in "
                      "the buffer, and a smaller buffer would hand every update the same few transitions")
    pretraining = command != "finetune" and pretrains(config)  # this run has a pre-training phase
    phases = {"pretrain_frames": pretraining, "finetune_frames": command != "pretrain"}
    for key in (key for key, runs in phases.items() if runs):
        if getattr(config, key) // config.env.action_repeat <= config.training.seed_transitions:
            raise invalid(key, getattr(config, key), "more than training.seed_transitions="
                          f"{config.training.seed_transitions} agent steps of env.action_repeat="
                          f"{config.env.action_repeat} frames each: no agent update would run")
    if config.env.camera_id is not None:
        _check_camera(config, tasks)
    if len(set(config.finetune_tasks)) != len(config.finetune_tasks):
        raise invalid("finetune_tasks", list(config.finetune_tasks), "a list of distinct task names")
    if command == "train" and pretraining:
        pretrain_domain = split_task(config.pretrain_task or config.task)[0]
        other = [task for task in config.downstream_tasks if split_task(task)[0] != pretrain_domain]
        if other:
            raise ConfigError(f"downstream task(s) {', '.join(other)} are not of the pre-training task's domain "
                              f"{pretrain_domain!r}: a snapshot serves the tasks of its own domain only")
    if config.replay.pretrain_data_share != 0:
        _check_pretrain_data(config, command, pretraining)
    if command == "finetune" and not (config.snapshot or config.pretrain_sweep) and has_pretraining:
        raise ConfigError("finetune needs a pre-training snapshot: add snapshot=/path/to/snapshot.pt or "
                          "pretrain_sweep=<a pre-training sweep's directory>; protorl-pretrain preset=small writes "
                          "one in minutes (<its run directory>/pretrain/snapshots/snapshot_4000.pt, for "
                          "protorl-finetune preset=small snapshot=...), and protorl-train runs both phases (or "
                          "run protorl-train pretrain_frames=0 to learn without pre-training)")


def check_named_task(config: Config, command: str, named: Collection[str] = ("task",)) -> None:
    """A `task` the user named (`named`: the keys they set) is a task of the run, unless they also set what takes
    its place: `pretrain_task` and `finetune_tasks`, from a preset, would otherwise run other tasks silently."""
    if "task" not in named:
        return
    tasks, in_its_place = [], {}
    if command != "pretrain":
        tasks += config.downstream_tasks
        if config.finetune_tasks:
            in_its_place["finetune_tasks"] = f"finetune_tasks=[{','.join(config.finetune_tasks)}]"
        if command == "finetune" and config.pretrain_sweep and not config.pretrain_task:
            tasks.append(config.task)  # it picks the sweep's snapshot
    if command != "finetune" and pretrains(config):
        tasks.append(config.pretrain_task or config.task)
        if config.pretrain_task:
            in_its_place["pretrain_task"] = f"pretrain_task={config.pretrain_task}"
    if config.task not in tasks and not set(in_its_place) & set(named):
        fixes = {"finetune_tasks": f"finetune_tasks=[{config.task}]", "pretrain_task": "pretrain_task=null"}
        presets = ", or choose a preset that runs env, such as preset=small or preset=paper" if command == "train" \
            else ""
        raise ConfigError(f"task={config.task} is not a task of this run: {' and '.join(in_its_place.values())}, set "
                          f"by the preset or config, name its tasks instead; add "
                          f"{' and '.join(fixes[key] for key in in_its_place)}{presets}")


def _check_pretrain_data(config: Config, command: str, pretraining: bool) -> None:
    """Fine-tuning on the pre-training's data: a share of the batch, simulated tasks, a replay in the snapshot
    (`pretraining`: whether this run pre-trains, so that its own snapshot must hold the replay)."""
    for task in config.downstream_tasks if command != "pretrain" else []:
        if gymnasium_id(task) is not None:
            raise invalid("replay.pretrain_data_share", config.replay.pretrain_data_share, f"0 for {task}: "
                          "relabelling the pre-training's data needs a simulated task's physical states (DeepMind "
                          "Control tasks)")
    if command == "train" and pretraining and not config.snapshots.with_replay:
        raise invalid("snapshots.with_replay", config.snapshots.with_replay, "true with "
                      "replay.pretrain_data_share > 0: the snapshot must hold the pre-training's replay buffer")


def _check_camera(config: Config, tasks: list[str]) -> None:
    """`env.camera_id` is a camera of every task's scene."""
    for task in tasks:
        env = make_env(task, config.env, seed=0)
        try:
            cameras = env.num_cameras if isinstance(env, Simulated) else None
        finally:
            env.close()
        if cameras is None:
            raise ConfigError(f"invalid config value env.camera_id={config.env.camera_id!r}: task {task} has no "
                              "cameras to choose from (it renders its own view); leave env.camera_id unset")
        if not 0 <= config.env.camera_id < cameras:
            raise ConfigError(f"invalid config value env.camera_id={config.env.camera_id!r}: task {task} has cameras 0 "
                              f"to {cameras - 1}")
