"""Start-up checks of a run's config: each value, and the command x agent x tasks combination, before anything is
built or written (`protorl.app.cli` calls `validate` once per run, or once per job of a sweep)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from protorl.agents import Agent, agent_class, agent_config, pretrains, registered_agents
from protorl.config import EVAL_SEED_OFFSET, MAX_SEED, AgentConfig, Config, ConfigError, downstream_tasks, invalid
from protorl.envs import Simulated, check_task, make_env, split_task
from protorl.envs.names import gymnasium_id
from protorl.logs.tracking import wandb_available
from protorl.runtime import device_problem

_POSITIVE_INTS = {
    "finetune_frames", "replay_capacity", "update_every_steps", "updates_per_step",
    "eval_every_frames", "log_every_episodes", "video_size",
}


def validate(cfg: Config, command: str) -> None:
    """Raise `ConfigError` naming the first invalid value; called before anything is built or written.

    `command`: "pretrain", "finetune" or "train" (both phases).
    """
    _check_numbers(cfg)
    agent = _check_agent(cfg, command)
    _check_schedules(cfg)
    _check_process(cfg)
    _check_observations(cfg)
    _check_tasks(cfg, command, agent.supports("pretrain"))


def fail(key: str, value, expected: str) -> None:
    """Raise the `ConfigError` of an invalid value."""
    raise invalid(key, value, expected)


def _check_numbers(cfg: Config) -> None:
    """Every float finite; the seed in range; the counts that must be positive."""
    for key, value in _float_values(cfg):
        if not math.isfinite(value):
            fail(key, value, "a finite number")
    if not 0 <= cfg.seed <= MAX_SEED:
        fail("seed", cfg.seed, f"an integer in [0, {MAX_SEED}] (seeds are 32-bit; evaluation uses seed + "
             f"{EVAL_SEED_OFFSET})")
    for key in sorted(_POSITIVE_INTS):
        if getattr(cfg, key) <= 0:
            fail(key, getattr(cfg, key), "a positive integer")


def _check_agent(cfg: Config, command: str) -> type[Agent]:
    """The agent, its own config, and whether it has the phases `command` runs."""
    agent = agent_class(cfg.agent.name)
    if type(cfg.agent) not in (agent.config_class, AgentConfig):
        fail("agent.name", cfg.agent.name, f"the agent of the config chosen ({type(cfg.agent).__name__}): set the "
             "agent with agent=NAME")
    agent_config(cfg.agent).check()
    if cfg.pretrain_frames < 0 or (command == "pretrain" and cfg.pretrain_frames == 0):
        fail("pretrain_frames", cfg.pretrain_frames, "a positive integer (0 only with protorl-train: no pre-training)")
    has_pretraining = agent.supports("pretrain")
    if command == "pretrain" and not has_pretraining:
        fail("agent", agent.name, "an agent with a task-agnostic phase: DrQ learns from the task reward only "
             "(run it with protorl-train or protorl-finetune)")
    if command == "train" and has_pretraining and cfg.pretrain_frames == 0 and not agent.supports("online"):
        fail("pretrain_frames", 0, f"a positive integer: agent={agent.name} learns its representation only "
             "in pre-training (agents without pre-training: "
             f"{', '.join(name for name, a in registered_agents().items() if a.supports('online'))})")
    return agent


def _check_schedules(cfg: Config) -> None:
    """Seeding, evaluation, checkpoints, analyses and snapshots: counts and frame schedules."""
    if cfg.seed_transitions < 0:
        fail("seed_transitions", cfg.seed_transitions, "an integer >= 0")
    if cfg.eval_episodes < 0:
        fail("eval_episodes", cfg.eval_episodes, "an integer >= 0")
    if cfg.checkpoint_every_frames is not None and cfg.checkpoint_every_frames <= 0:
        fail("checkpoint_every_frames", cfg.checkpoint_every_frames, "a positive frame count or null")
    if cfg.checkpoint_every_minutes is not None and cfg.checkpoint_every_minutes <= 0:
        fail("checkpoint_every_minutes", cfg.checkpoint_every_minutes, "a positive number of minutes or null")
    if cfg.max_hours is not None and cfg.max_hours <= 0:
        fail("max_hours", cfg.max_hours, "a positive number of hours, or null for no limit")
    if cfg.checkpoint_keep <= 0:
        fail("checkpoint_keep", cfg.checkpoint_keep, "a positive integer")
    if cfg.analysis_every_frames is not None and cfg.analysis_every_frames <= 0:
        fail("analysis_every_frames", cfg.analysis_every_frames, "a positive frame count or null")
    if cfg.coverage_bins < 2:
        fail("coverage_bins", cfg.coverage_bins, "an integer >= 2")
    if cfg.probe_samples is not None and cfg.probe_samples < 20:
        fail("probe_samples", cfg.probe_samples, "null or at least 20 frames (a quarter of them are held out)")
    if cfg.variance_repeats < 2:
        fail("variance_repeats", cfg.variance_repeats, "an integer >= 2 (a spread needs two draws)")
    for key in ("variance_probes", "map_samples"):
        if getattr(cfg, key) <= 0:
            fail(key, getattr(cfg, key), "a positive integer")
    if any(f <= 0 for f in cfg.snapshot_at_frames):
        fail("snapshot_at_frames", list(cfg.snapshot_at_frames), "a list of positive frame counts")


def _check_process(cfg: Config) -> None:
    """Tracking, threads and the device."""
    if cfg.wandb:
        if not wandb_available():
            fail("wandb", True, "false, or install the wandb package first: pip install -e \".[wandb]\"")
    if cfg.threads is not None and cfg.threads <= 0:
        fail("threads", cfg.threads, "a positive integer or null")
    problem = device_problem(cfg.device)
    if problem is not None:
        fail("device", cfg.device, problem)


def _check_observations(cfg: Config) -> None:
    """Pixels or states, and the frames' sizes."""
    if cfg.obs not in ("pixels", "states"):
        fail("obs", cfg.obs, "'pixels' or 'states'")
    for key in ("image_size", "frame_stack", "action_repeat"):
        if getattr(cfg, key) <= 0:
            fail(key, getattr(cfg, key), "a positive integer")
    if cfg.obs == "pixels" and cfg.image_size < 15:
        fail("image_size", cfg.image_size, "at least 15 pixels (the 4-layer conv encoder needs a 1x1 output)")


def _check_tasks(cfg: Config, command: str, has_pretraining: bool) -> None:
    """The tasks exist, fit the replay and the frame budgets, share the pre-training's domain; fine-tuning has a
    snapshot."""
    tasks = [cfg.env, *([cfg.pretrain_env] if cfg.pretrain_env is not None else []), *cfg.finetune_envs]
    for task in tasks:
        check_task(task)
    for task in dict.fromkeys(task for task in tasks if gymnasium_id(task) is not None):  # its spaces, built once
        try:
            make_env(task, cfg, seed=0).close()
        except ValueError as error:
            raise ConfigError(str(error)) from None
    frame_stack = cfg.frame_stack if cfg.obs == "pixels" else 1
    if cfg.replay_capacity < frame_stack + cfg.agent.batch_size:
        fail("replay_capacity", cfg.replay_capacity, f"at least the frame stack plus one batch ({frame_stack} + "
             f"agent.batch_size {cfg.agent.batch_size}): a transition needs its stacks in the buffer, and a smaller "
             "buffer would hand every update the same few transitions")
    phases = {"pretrain_frames": command != "finetune" and pretrains(cfg),
              "finetune_frames": command != "pretrain"}
    for key in (key for key, runs in phases.items() if runs):
        if getattr(cfg, key) // cfg.action_repeat <= cfg.seed_transitions:
            fail(key, getattr(cfg, key), f"more than seed_transitions={cfg.seed_transitions} agent steps of "
                 f"action_repeat={cfg.action_repeat} frames each: no agent update would run")
    if cfg.camera_id is not None:
        _check_camera(cfg, [cfg.env, *([cfg.pretrain_env] if cfg.pretrain_env else []), *cfg.finetune_envs])
    if len(set(cfg.finetune_envs)) != len(cfg.finetune_envs):
        fail("finetune_envs", list(cfg.finetune_envs), "a list of distinct task names")
    if command == "train" and pretrains(cfg):
        pretrain_domain = split_task(cfg.pretrain_env or cfg.env)[0]
        other = [task for task in downstream_tasks(cfg) if split_task(task)[0] != pretrain_domain]
        if other:
            raise ConfigError(f"downstream task(s) {', '.join(other)} are not of the pre-training task's domain "
                              f"{pretrain_domain!r}: a snapshot serves the tasks of its own domain only")
    if cfg.pretrain_data_share != 0:
        _check_pretrain_data(cfg, command)
    if command == "finetune" and not (cfg.snapshot or cfg.pretrain_sweep) and has_pretraining:
        raise ConfigError("finetune needs a pre-training snapshot: add snapshot=/path/to/snapshot.pt or "
                          "pretrain_sweep=<a pre-training sweep's directory>; protorl-pretrain preset=small writes "
                          "one in minutes (<its run directory>/pretrain/snapshots/snapshot_4000.pt, for "
                          "protorl-finetune preset=small snapshot=...), and protorl-train runs both phases (or "
                          "run protorl-train pretrain_frames=0 to learn without pre-training)")


def check_named_env(cfg: Config, command: str, named: Collection[str] = ("env",)) -> None:
    """An `env` the user named (`named`: the keys they set) is a task of the run, unless they also set what takes
    its place: `pretrain_env` and `finetune_envs`, from a preset, would otherwise run other tasks silently."""
    if "env" not in named:
        return
    tasks, in_its_place = [], {}
    if command != "pretrain":
        tasks += downstream_tasks(cfg)
        if cfg.finetune_envs:
            in_its_place["finetune_envs"] = f"finetune_envs=[{','.join(cfg.finetune_envs)}]"
        if command == "finetune" and cfg.pretrain_sweep and not cfg.pretrain_env:
            tasks.append(cfg.env)  # it picks the sweep's snapshot
    if command != "finetune" and pretrains(cfg):
        tasks.append(cfg.pretrain_env or cfg.env)
        if cfg.pretrain_env:
            in_its_place["pretrain_env"] = f"pretrain_env={cfg.pretrain_env}"
    if cfg.env not in tasks and not set(in_its_place) & set(named):
        fixes = {"finetune_envs": f"finetune_envs=[{cfg.env}]", "pretrain_env": "pretrain_env=null"}
        presets = ", or choose a preset that runs env, such as preset=small or preset=paper" if command == "train" \
            else ""
        raise ConfigError(f"env={cfg.env} is not a task of this run: {' and '.join(in_its_place.values())}, set by "
                          f"the preset or config, name its tasks instead; add "
                          f"{' and '.join(fixes[key] for key in in_its_place)}{presets}")


def _check_pretrain_data(cfg: Config, command: str) -> None:
    """Fine-tuning on the pre-training's data: a share of the batch, simulated tasks, a replay in the snapshot."""
    if not 0 <= cfg.pretrain_data_share < 1:
        fail("pretrain_data_share", cfg.pretrain_data_share, "a number in [0, 1): the share of each fine-tuning "
             "batch drawn from the pre-training's replay")
    for task in downstream_tasks(cfg) if command != "pretrain" else []:
        if gymnasium_id(task) is not None:
            fail("pretrain_data_share", cfg.pretrain_data_share, f"0 for {task}: relabelling the pre-training's "
                 "data needs a simulated task's physical states (DeepMind Control tasks)")
    if command == "train" and pretrains(cfg) and not cfg.snapshot_replay:
        fail("snapshot_replay", cfg.snapshot_replay, "true with pretrain_data_share > 0: the snapshot must hold "
             "the pre-training's replay buffer")


def _float_values(cfg: Config) -> list[tuple[str, float]]:
    """(dotted key, value) of every float setting, the agent's included."""
    values = []
    for prefix, node in (("", cfg), ("agent.", cfg.agent)):
        for item in dataclasses.fields(node):
            value = getattr(node, item.name)
            if isinstance(value, float):
                values.append((prefix + item.name, value))
    return values


def _check_camera(cfg: Config, tasks: list[str]) -> None:
    for task in tasks:
        env = make_env(task, cfg, seed=0)
        if not isinstance(env, Simulated):
            raise ConfigError(f"invalid config value camera_id={cfg.camera_id!r}: task {task} has no cameras to "
                              "choose from (it renders its own view); leave camera_id unset")
        if not 0 <= cfg.camera_id < env.num_cameras:
            raise ConfigError(f"invalid config value camera_id={cfg.camera_id!r}: task {task} has cameras 0 to "
                              f"{env.num_cameras - 1}")
