"""Start-up checks of a run's config: each value, and the command x agent x tasks combination, before anything is
built or written (`protorl.app.cli` calls `validate` once per run, or once per job of a sweep)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from protorl.agents import Agent, agent_class, agent_config, pretrains, registered_agents
from protorl.config import (
    EVAL_SEED_OFFSET,
    GROUPS,
    MAX_SEED,
    AgentConfig,
    Config,
    ConfigError,
    downstream_tasks,
    invalid,
)
from protorl.envs import Simulated, check_task, make_env, split_task
from protorl.envs.names import gymnasium_id
from protorl.logs.tracking import wandb_available
from protorl.runtime import device_problem


def validate(config: Config, command: str) -> None:
    """Raise `ConfigError` naming the first invalid value; called before anything is built or written.

    `command`: "pretrain", "finetune" or "train" (both phases).
    """
    _check_numbers(config)
    for group in GROUPS:
        getattr(config, group).check()
    agent = _check_agent(config, command)
    _check_process(config)
    _check_tasks(config, command, agent.supports("pretrain"))


def fail(key: str, value, expected: str) -> None:
    """Raise the `ConfigError` of an invalid value."""
    raise invalid(key, value, expected)


def _check_numbers(config: Config) -> None:
    """Every float finite; the seed and the fine-tuning's frames in range."""
    for key, value in _float_values(config):
        if not math.isfinite(value):
            fail(key, value, "a finite number")
    if not 0 <= config.seed <= MAX_SEED:
        fail("seed", config.seed, f"an integer in [0, {MAX_SEED}] (seeds are 32-bit; evaluation uses seed + "
             f"{EVAL_SEED_OFFSET})")
    if config.finetune_frames <= 0:
        fail("finetune_frames", config.finetune_frames, "a positive integer")


def _check_agent(config: Config, command: str) -> type[Agent]:
    """The agent, its own config, and whether it has the phases `command` runs."""
    agent = agent_class(config.agent.name)
    if type(config.agent) not in (agent.config_class, AgentConfig):
        fail("agent.name", config.agent.name, f"the agent of the config chosen ({type(config.agent).__name__}): set "
             "the agent with agent=NAME")
    agent_config(config.agent).check()
    if config.pretrain_frames < 0 or (command == "pretrain" and config.pretrain_frames == 0):
        fail("pretrain_frames", config.pretrain_frames,
             "a positive integer (0 only with protorl-train: no pre-training)")
    has_pretraining = agent.supports("pretrain")
    if command == "pretrain" and not has_pretraining:
        fail("agent", agent.name, "an agent with a task-agnostic phase: DrQ learns from the task reward only "
             "(run it with protorl-train or protorl-finetune)")
    if command == "train" and has_pretraining and config.pretrain_frames == 0 and not agent.supports("online"):
        fail("pretrain_frames", 0, f"a positive integer: agent={agent.name} learns its representation only "
             "in pre-training (agents without pre-training: "
             f"{', '.join(name for name, a in registered_agents().items() if a.supports('online'))})")
    return agent


def _check_process(config: Config) -> None:
    """Tracking and the device: what this machine has."""
    if config.logging.wandb and not wandb_available():
        fail("logging.wandb", True, "false, or install the wandb package first: pip install -e \".[wandb]\"")
    problem = device_problem(config.runtime.device)
    if problem is not None:
        fail("runtime.device", config.runtime.device, problem)


def _check_tasks(config: Config, command: str, has_pretraining: bool) -> None:
    """The tasks exist, fit the replay and the frame budgets, share the pre-training's domain; fine-tuning has a
    snapshot."""
    tasks = [config.task, *([config.pretrain_task] if config.pretrain_task is not None else []), *config.finetune_tasks]
    for task in tasks:
        check_task(task)
    for task in dict.fromkeys(task for task in tasks if gymnasium_id(task) is not None):  # its spaces, built once
        try:
            make_env(task, config.env, seed=0).close()
        except ValueError as error:
            raise ConfigError(str(error)) from None
    frame_stack = config.env.frame_stack if config.env.obs == "pixels" else 1
    if config.replay.capacity < frame_stack + config.agent.batch_size:
        fail("replay.capacity", config.replay.capacity, f"at least the frame stack plus one batch ({frame_stack} + "
             f"agent.batch_size {config.agent.batch_size}): a transition needs its stacks in the buffer, and a smaller "
             "buffer would hand every update the same few transitions")
    phases = {"pretrain_frames": command != "finetune" and pretrains(config),
              "finetune_frames": command != "pretrain"}
    for key in (key for key, runs in phases.items() if runs):
        if getattr(config, key) // config.env.action_repeat <= config.training.seed_transitions:
            fail(key, getattr(config, key), f"more than training.seed_transitions={config.training.seed_transitions} "
                 f"agent steps of env.action_repeat={config.env.action_repeat} frames each: no agent update would run")
    if config.env.camera_id is not None:
        _check_camera(config, [config.task, *([config.pretrain_task] if config.pretrain_task else []),
                               *config.finetune_tasks])
    if len(set(config.finetune_tasks)) != len(config.finetune_tasks):
        fail("finetune_tasks", list(config.finetune_tasks), "a list of distinct task names")
    if command == "train" and pretrains(config):
        pretrain_domain = split_task(config.pretrain_task or config.task)[0]
        other = [task for task in downstream_tasks(config) if split_task(task)[0] != pretrain_domain]
        if other:
            raise ConfigError(f"downstream task(s) {', '.join(other)} are not of the pre-training task's domain "
                              f"{pretrain_domain!r}: a snapshot serves the tasks of its own domain only")
    if config.replay.pretrain_data_share != 0:
        _check_pretrain_data(config, command)
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
        tasks += downstream_tasks(config)
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


def _check_pretrain_data(config: Config, command: str) -> None:
    """Fine-tuning on the pre-training's data: a share of the batch, simulated tasks, a replay in the snapshot."""
    for task in downstream_tasks(config) if command != "pretrain" else []:
        if gymnasium_id(task) is not None:
            fail("replay.pretrain_data_share", config.replay.pretrain_data_share, f"0 for {task}: relabelling the "
                 "pre-training's data needs a simulated task's physical states (DeepMind Control tasks)")
    if command == "train" and pretrains(config) and not config.snapshots.with_replay:
        fail("snapshots.with_replay", config.snapshots.with_replay, "true with replay.pretrain_data_share > 0: the "
             "snapshot must hold the pre-training's replay buffer")


def _float_values(config: Config) -> list[tuple[str, float]]:
    """(dotted key, value) of every float setting, the agent's included."""
    values = []
    groups = ((f"{group}.", getattr(config, group)) for group in GROUPS)
    for prefix, node in (("", config), *groups, ("agent.", config.agent)):
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            if isinstance(value, float):
                values.append((prefix + item.name, value))
    return values


def _check_camera(config: Config, tasks: list[str]) -> None:
    for task in tasks:
        env = make_env(task, config.env, seed=0)
        if not isinstance(env, Simulated):
            raise ConfigError(f"invalid config value env.camera_id={config.env.camera_id!r}: task {task} has no "
                              "cameras to choose from (it renders its own view); leave env.camera_id unset")
        if not 0 <= config.env.camera_id < env.num_cameras:
            raise ConfigError(f"invalid config value env.camera_id={config.env.camera_id!r}: task {task} has cameras 0 "
                              f"to {env.num_cameras - 1}")
