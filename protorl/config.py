"""Typed run configuration with the paper's defaults (appendix C, table 1).

Units: every `*_frames` value counts environment frames; an agent step is `env.action_repeat` frames.
The Hydra YAML files in `protorl/conf/` build on this schema; `protorl.app.plan` types and checks them at start-up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from omegaconf import MISSING

from protorl.errors import ConfigError

__all__ = ["EVAL_SEED_OFFSET", "GROUPS", "MAX_SEED", "RENAMED", "AgentConfig", "AnalysesConfig", "CheckpointsConfig",
           "Config", "ConfigError", "EnvConfig", "EvaluationConfig", "LoggingConfig", "ReplayConfig", "RuntimeConfig",
           "SnapshotsConfig", "TrainingConfig", "architecture", "architecture_keys", "free",
           "grouped", "in_unit_interval", "invalid", "positive", "renamed_message", "rerun_free_keys",
           "unknown_key_message"]


def architecture(default):
    """An agent setting that fixes the shapes or kind of its snapshot's networks: fine-tuning refuses a snapshot
    pre-trained with another value (`architecture_keys`)."""
    return field(default=default, metadata={"architecture": True})


def free(default):
    """A setting that changes how a run is watched or where it runs, not what it computes: a run directory is
    continued with it changed (`rerun_free_keys`)."""
    return field(default=default, metadata={"rerun_free": True})


@dataclass
class AgentConfig:
    """What every agent shares: the optimiser, the batch and the SAC core (table 1 of the paper). Each agent's
    own hyper-parameters are a subclass in its module (e.g. `protorl.agents.proto.agent.ProtoConfig`), chosen with
    `agent=NAME`."""

    name: str = "proto"  # which agent: one of protorl.agents.registered_agents() (set with `agent=NAME`)
    lr: float = 1e-4
    batch_size: int = 512
    discount: float = 0.99
    # SAC (appendix C.4)
    feature_dim: int = architecture(50)  # trunk Linear(repr -> 50) + LayerNorm
    hidden_dim: int = architecture(1024)
    hidden_depth: int = architecture(2)
    init_temperature: float = 0.1  # SAC's entropy temperature at the start
    log_std_min: float = -10.0
    log_std_max: float = 2.0
    actor_update_every: int = 2  # the table says 2, the text of C.4 says 1: we follow the table
    critic_target_update_every: int = 2
    critic_target_tau: float = 0.01  # EMA rate of the critic's target
    augment_pad: int = 4  # random shift of +-4 pixels; 0 disables augmentation
    state_hidden_dim: int = architecture(256)  # the encoder used when env.obs == "states" (replaces the conv encoder)
    # How the pixel encoder computes, not what: results equal to float rounding (docs/benchmarks/index.md).
    encoder_micro_batch: int | None = None  # convolve at most this many samples at once; 0: the whole batch;
    # None: the device's measured best (protorl.agents.networks.micro_batch_for)
    bf16_autocast: bool = False  # convolutions in bfloat16 (off until measured on the device)
    compile_encoder: bool = False  # torch.compile the pixel encoders (off until measured on the device)
    # Fine-tuning from a pre-trained actor (Proto-RL downstream). Each departs from the paper, which starts a fresh
    # critic and temperature next to the exploration actor; 0 / false: the paper (docs, "Fine-tuning that keeps
    # what pre-training learned").
    critic_warmup_updates: int = 0  # the first N downstream updates train the critic alone: actor, temperature held
    actor_anchor_coef: float = 0.0  # penalty coef * |mean action - pre-trained actor's mean action|^2 ...
    actor_anchor_updates: int = 0  # ... decaying linearly to 0 over this many downstream updates
    init_critic: bool = False  # start the downstream critic from the exploration critic (the snapshot's)

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value; subclasses check their own fields too."""
        positive("agent", self, "batch_size", "feature_dim", "hidden_dim", "hidden_depth", "actor_update_every",
                 "critic_target_update_every", "state_hidden_dim")
        in_unit_interval("agent", self, "discount", "critic_target_tau")
        if self.lr <= 0:
            raise invalid("agent.lr", self.lr, "a positive number")
        if self.init_temperature <= 0:
            raise invalid("agent.init_temperature", self.init_temperature, "a positive number")
        if self.augment_pad < 0:
            raise invalid("agent.augment_pad", self.augment_pad, "an integer >= 0")
        if self.encoder_micro_batch is not None and self.encoder_micro_batch < 0:
            raise invalid("agent.encoder_micro_batch", self.encoder_micro_batch, "an integer >= 0, or null")
        if self.critic_warmup_updates < 0:
            raise invalid("agent.critic_warmup_updates", self.critic_warmup_updates, "an integer >= 0")
        if self.actor_anchor_coef < 0:
            raise invalid("agent.actor_anchor_coef", self.actor_anchor_coef, "a number >= 0")
        if self.actor_anchor_coef > 0 and self.actor_anchor_updates <= 0:
            raise invalid("agent.actor_anchor_updates", self.actor_anchor_updates,
                          "a positive number of updates with agent.actor_anchor_coef > 0 (the penalty's decay)")
        if self.log_std_min >= self.log_std_max:
            raise invalid("agent.log_std_min", self.log_std_min, f"less than agent.log_std_max={self.log_std_max}")


def invalid(key: str, value, expected: str) -> ConfigError:
    """The error for `key=value`, saying what was expected."""
    return ConfigError(f"invalid config value {key}={value!r}: expected {expected}")


def positive(prefix: str, node, *keys: str) -> None:
    """Raise `ConfigError` for the first of `keys` of `node` that is not a positive number."""
    for key in keys:
        if getattr(node, key) <= 0:
            raise invalid(f"{prefix}.{key}", getattr(node, key), "a positive integer")


def in_unit_interval(prefix: str, node, *keys: str) -> None:
    """Raise `ConfigError` for the first of `keys` of `node` outside (0, 1]."""
    for key in keys:
        if not 0.0 < getattr(node, key) <= 1.0:
            raise invalid(f"{prefix}.{key}", getattr(node, key), "a number in (0, 1]")


@dataclass
class EnvConfig:
    """How a task is observed and stepped (appendix C.1): what `protorl.envs.make_env` takes."""

    obs: str = "pixels"  # "pixels" (stacked RGB frames) or "states" (the suite's proprioceptive vector)
    image_size: int = 84
    frame_stack: int = 3  # pixels only; state observations are not stacked
    action_repeat: int = 2  # frames per agent step
    camera_id: int | None = None  # None: camera 2 for quadruped, camera 0 otherwise

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        if self.obs not in ("pixels", "states"):
            raise invalid("env.obs", self.obs, "'pixels' or 'states'")
        positive("env", self, "image_size", "frame_stack", "action_repeat")
        if self.obs == "pixels" and self.image_size < 15:
            raise invalid("env.image_size", self.image_size,
                          "at least 15 pixels (the 4-layer conv encoder needs a 1x1 output)")


@dataclass
class TrainingConfig:
    """The loop's schedule: when the agent acts at random and how often it updates."""

    seed_transitions: int = 1000  # agent steps of a uniform-random policy before updates start
    update_every_steps: int = 1  # one agent update per agent step
    updates_per_step: int = 1  # agent updates at each updating step (the update-to-data ratio; the paper: 1)

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        if self.seed_transitions < 0:
            raise invalid("training.seed_transitions", self.seed_transitions, "an integer >= 0")
        positive("training", self, "update_every_steps", "updates_per_step")

    def updates_at(self, agent_step: int) -> int:
        """The agent updates at agent step `agent_step` of a phase (from 0): none while seeding nor before the
        replay holds a transition, `updates_per_step` every `update_every_steps` steps after."""
        due = agent_step >= max(self.seed_transitions, 1) and agent_step % self.update_every_steps == 0
        return self.updates_per_step if due else 0


@dataclass
class ReplayConfig:
    """The replay buffer of a phase."""

    capacity: int = 100_000  # stored agent steps (slots): each episode's first frame takes one too
    # also keep the replay's frames in the accelerator's memory and sample there (a 100k-frame pixel buffer is
    # ~2 GB); None: when the device is CUDA and they take under half its free memory
    on_device: bool | None = free(None)  # the same results either way
    # fine-tuning on the pre-training's data, a departure from the paper (docs/finetuning.md): this share of every
    # fine-tuning batch comes from the snapshot's replay (`snapshots.with_replay`), its rewards relabelled for the
    # downstream task; 0: the paper
    pretrain_data_share: float = 0.0

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        positive("replay", self, "capacity")
        if not 0 <= self.pretrain_data_share < 1:
            raise invalid("replay.pretrain_data_share", self.pretrain_data_share, "a number in [0, 1): the share "
                          "of each fine-tuning batch drawn from the pre-training's replay")


@dataclass
class SnapshotsConfig:
    """The pre-training's snapshots, which fine-tuning starts from."""

    at_frames: list[int] = field(default_factory=lambda: [100_000, 200_000, 500_000, 1_000_000])
    # also hold the replay buffer with each frame's physical state, for `replay.pretrain_data_share` (per 100k
    # frames: the U-maze from states 3.6 MB, 84x84 pixels ~1 GB)
    with_replay: bool = False

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        if any(frames <= 0 for frames in self.at_frames):
            raise invalid("snapshots.at_frames", list(self.at_frames), "a list of positive frame counts")


@dataclass
class CheckpointsConfig:
    """The full training state, for an exact resume."""

    every_frames: int | None = free(100_000)  # at the next episode end; None: never
    every_minutes: float | None = free(None)  # also checkpoint when this much wall time has passed
    keep: int = free(2)  # newest checkpoints kept per phase
    keep_completed: bool = free(False)  # keep a phase's checkpoints once it has completed (else they are deleted)

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        if self.every_frames is not None and self.every_frames <= 0:
            raise invalid("checkpoints.every_frames", self.every_frames, "a positive frame count or null")
        if self.every_minutes is not None and self.every_minutes <= 0:
            raise invalid("checkpoints.every_minutes", self.every_minutes, "a positive number of minutes or null")
        positive("checkpoints", self, "keep")


@dataclass
class EvaluationConfig:
    """Evaluation episodes with the policy's mean action, on an environment of its own seed."""

    every_frames: int = 10_000
    episodes: int = 10
    during_pretrain: bool = False
    save_video: bool = free(False)
    video_size: int = free(256)

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        positive("evaluation", self, "every_frames", "episodes", "video_size")  # no episode: no score


PROBE_MIN_SAMPLES = 20  # frames a state probe fits on, at least (here and in protorl-probe)
PROBE_SAMPLES_RULE = f"at least {PROBE_MIN_SAMPLES} frames (a quarter of them are held out)"


@dataclass
class AnalysesConfig:
    """Pre-training analyses (protorl/exploration/): state coverage, maze maps, k-NN reward variance, state probe."""

    every_frames: int | None = 50_000  # also once at the end of pre-training; None: no analyses
    coverage_bins: int = 20  # bins per coverage coordinate (e.g. 20 x 20 cells of the maze's x, y)
    random_reference: bool = True  # also report the coverage of a uniform-random policy over the same frames
    variance_probes: int = 128  # probe states whose reward variance is measured, drawn once from the replay
    variance_repeats: int = 10  # candidate sets drawn per scheme (proto, uniform) and analysis
    map_samples: int = 2048  # replay observations encoded to place each prototype on the maze map
    # also probe the encoder (docs/probe.md) on this many uniform-random frames; None: not
    probe_samples: int | None = None

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        if self.every_frames is not None and self.every_frames <= 0:
            raise invalid("analyses.every_frames", self.every_frames, "a positive frame count or null")
        if self.coverage_bins < 2:
            raise invalid("analyses.coverage_bins", self.coverage_bins, "an integer >= 2")
        if self.probe_samples is not None and self.probe_samples < PROBE_MIN_SAMPLES:
            raise invalid("analyses.probe_samples", self.probe_samples, f"null or {PROBE_SAMPLES_RULE}")
        if self.variance_repeats < 2:
            raise invalid("analyses.variance_repeats", self.variance_repeats,
                          "an integer >= 2 (a spread needs two draws)")
        positive("analyses", self, "variance_probes", "map_samples")


@dataclass
class LoggingConfig:
    """Where the metrics go besides the phase's CSV files."""

    every_episodes: int = 1  # a train.csv row every this many episodes
    tensorboard: bool = True
    progress_bar: bool = free(True)
    wandb: bool = free(False)  # also log to Weights & Biases (needs `pip install -e ".[wandb]"`)
    wandb_project: str = free("protorl")
    wandb_entity: str | None = free(None)  # None: your default W&B entity
    wandb_group: str | None = free(None)  # e.g. one group per sweep

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value."""
        positive("logging", self, "every_episodes")


@dataclass
class RuntimeConfig:
    """How the process computes, not what: the device, threads, allocator and the wall-time limit."""

    device: str = free("auto")  # auto: CUDA when available, else CPU
    threads: int | None = None  # torch intra-op threads; None leaves torch's default (one per core)
    fast_malloc: bool = free(True)  # keep large tensors off glibc's mmap path (see protorl.runtime.tune_malloc)
    cudnn_benchmark: bool = True  # CUDA: cuDNN picks its fastest convolutions for the run's fixed shapes
    # step the training environment on a thread of its own while the agent updates: the same results. Off by
    # default: on a 2-core CPU its thread slows torch's down (docs/benchmarks/index.md); not yet measured on a GPU
    overlap_env_step: bool = free(False)
    # compile each agent update whole (torch.compile, one graph per combination of its parts; on CUDA replayed as
    # a CUDA graph): the same algorithm and random draws, other float rounding (protorl/agents/compiled.py).
    # Off by default until measured to pay back its compile time (docs/benchmarks/index.md)
    compile_update: bool = False
    # CUDA: float32 matrix products in TensorFloat-32 (a 10-bit mantissa; tensor cores), a departure from float32
    # arithmetic, labelled and off by default (docs/benchmarks/index.md); no effect on a CPU
    tf32: bool = False
    # refuse a run whose wall time, estimated on this machine before it starts (protorl/app/preflight.py), exceeds
    # this many hours; null: no limit
    max_hours: float | None = free(24.0)

    def check(self) -> None:
        """Raise `ConfigError` naming the first invalid value (the device is checked where it is resolved)."""
        if self.threads is not None and self.threads <= 0:
            raise invalid("runtime.threads", self.threads, "a positive integer or null")
        if self.max_hours is not None and self.max_hours <= 0:
            raise invalid("runtime.max_hours", self.max_hours, "a positive number of hours, or null for no limit")


@dataclass
class Config:
    """One run: which phase, on which task, for how long, where its outputs go; each part's settings in its group."""

    task: str = "point_mass_easy"  # task the agent is evaluated and fine-tuned on (`domain_task`)
    pretrain_task: str | None = None  # task-agnostic phase task; None: same as `task` (its reward is hidden)
    # downstream tasks of one pre-training (protorl-train, protorl-finetune), each in its own
    # `finetune_<task>/` directory; empty: `task` alone, in `finetune/`
    finetune_tasks: list[str] = field(default_factory=list)
    snapshot: str | None = None  # finetune: path of the pre-training snapshot to start from
    # finetune without `snapshot`: a pre-training sweep's directory; the snapshot is its run's of this agent, task
    # (`pretrain_task` or `task`) and seed, at `pretrain_frames` (protorl/storage/snapshots.py)
    pretrain_sweep: str | None = None
    # set by the commands: the digest the snapshot was written with (the SHA-256 of its content; of the whole file
    # for one written before digests existed), which identifies it wherever it lives (a run directory continues
    # from a snapshot moved elsewhere, and refuses another one at the same path, or this one changed)
    snapshot_sha256: str | None = None
    # also fine-tune each downstream task without pre-training, the same frames, in `finetune_scratch_<task>/`:
    # the agent's online mode (Proto-RL: appendix H), for the comparison that shows what pre-training bought
    compare_without_pretraining: bool = False
    # a line printed under that comparison: what one seed of these settings can show (the main job's: measured on
    # seeds it was not chosen on, docs/results/main-job.md); None: no line
    comparison_note: str | None = free(None)
    seed: int = 1
    pretrain_frames: int = 500_000  # 0 (protorl-train only): no pre-training, learn online from the task reward
    finetune_frames: int = 500_000
    resume: bool = free(True)  # continue the run already in `run_dir` (same settings); false: refuse such a directory
    start_over: bool = free(False)  # delete the run data already in `run_dir` and start again
    run_dir: str = free(MISSING)  # set by the YAML files to Hydra's output directory
    env: EnvConfig = field(default_factory=EnvConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    snapshots: SnapshotsConfig = field(default_factory=SnapshotsConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    analyses: AnalysesConfig = field(default_factory=AnalysesConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)  # the chosen agent's subclass (`agent=NAME`)

    @property
    def downstream_tasks(self) -> list[str]:
        """The tasks fine-tuned after one pre-training: `finetune_tasks`, or `task` alone."""
        return list(self.finetune_tasks) or [self.task]

    def runs_analyses(self, phase: str) -> bool:
        """Whether `phase` ("pretrain" or "finetune") runs the exploration analyses: pre-training with
        `analyses.every_frames`."""
        return phase == "pretrain" and self.analyses.every_frames is not None

    def keeps_physical_states(self, phase: str) -> bool:
        """Whether the replay buffer of `phase` keeps every frame's physical state: for the analyses, or for a
        snapshot's replay (`snapshots.with_replay`), which fine-tuning relabels with a task's reward."""
        return self.runs_analyses(phase) or (phase == "pretrain" and self.snapshots.with_replay)


GROUPS = ("env", "training", "replay", "snapshots", "checkpoints", "evaluation", "analyses", "logging", "runtime")

# Agent configs (`agent=NAME`) renamed, and what each is now: Proto-RL as published was `proto_paper` when
# `agent=proto` meant the preset's choice
RENAMED_AGENTS = {"proto_paper": "proto"}
# Experiment presets renamed, and what each is now: at URLB's 2M budget the departures' fine-tuning is named as such
RENAMED_EXPERIMENTS = {f"{domain}_urlb_finetune_2m": f"{domain}_urlb_departures_finetune_2m"
                       for domain in ("walker", "quadruped", "reach_duplo")}

# The keys of the flat config before the groups, and what each is now
RENAMED = {
    "env": "task", "pretrain_env": "pretrain_task", "finetune_envs": "finetune_tasks",
    "obs": "env.obs", "image_size": "env.image_size", "frame_stack": "env.frame_stack",
    "action_repeat": "env.action_repeat", "camera_id": "env.camera_id",
    "seed_transitions": "training.seed_transitions", "update_every_steps": "training.update_every_steps",
    "updates_per_step": "training.updates_per_step",
    "replay_capacity": "replay.capacity", "replay_on_device": "replay.on_device",
    "pretrain_data_share": "replay.pretrain_data_share",
    "snapshot_at_frames": "snapshots.at_frames", "snapshot_replay": "snapshots.with_replay",
    "checkpoint_every_frames": "checkpoints.every_frames", "checkpoint_every_minutes": "checkpoints.every_minutes",
    "checkpoint_keep": "checkpoints.keep", "keep_checkpoints": "checkpoints.keep_completed",
    "eval_every_frames": "evaluation.every_frames", "eval_episodes": "evaluation.episodes",
    "eval_during_pretrain": "evaluation.during_pretrain", "save_video": "evaluation.save_video",
    "video_size": "evaluation.video_size",
    "analysis_every_frames": "analyses.every_frames", "coverage_bins": "analyses.coverage_bins",
    "random_reference": "analyses.random_reference", "variance_probes": "analyses.variance_probes",
    "variance_repeats": "analyses.variance_repeats", "map_samples": "analyses.map_samples",
    "probe_samples": "analyses.probe_samples",
    "log_every_episodes": "logging.every_episodes", "tensorboard": "logging.tensorboard",
    "progress_bar": "logging.progress_bar", "wandb": "logging.wandb", "wandb_project": "logging.wandb_project",
    "wandb_entity": "logging.wandb_entity", "wandb_group": "logging.wandb_group",
    "device": "runtime.device", "threads": "runtime.threads", "fast_malloc": "runtime.fast_malloc",
    "cudnn_benchmark": "runtime.cudnn_benchmark", "overlap_env_step": "runtime.overlap_env_step",
    "max_hours": "runtime.max_hours",
}


def renamed_message(key: str, value: object = None) -> str | None:
    """The one line that refuses a key of the flat config set to `value`, naming the key that replaced it; None for
    a key that was not renamed (`env` is a group now: renamed only where its value is a task's name)."""
    if key not in RENAMED or (key == "env" and not isinstance(value, str)):
        return None
    return f"{key} is now {RENAMED[key]}: the settings are grouped (every key: docs/commands.md; CHANGELOG.md)"


def architecture_keys(config_class: type[AgentConfig]) -> tuple[str, ...]:
    """The keys of an agent's config marked `architecture`, in their order: those a snapshot must match."""
    return tuple(f.name for f in dataclasses.fields(config_class) if f.metadata.get("architecture"))


def rerun_free_keys() -> frozenset[str]:
    """The dotted keys of the settings marked `free`: they may differ between the commands that write one run
    directory, and a checkpoint of the run resumes whatever they are."""
    def marked(config: object, prefix: str) -> list[str]:
        return [key for f in dataclasses.fields(config) for key in (
            [prefix + f.name] if f.metadata.get("rerun_free") else
            marked(getattr(config, f.name), f"{prefix}{f.name}.") if dataclasses.is_dataclass(getattr(config, f.name))
            else [])]

    return frozenset(marked(Config(), ""))


def unknown_key_message(keys: list[str]) -> str:
    """The one line that refuses keys protorl does not have (dotted: `group.key`)."""
    return f"unknown config key {', '.join(keys)}: not a protorl setting (every key: docs/commands.md)"


def grouped(saved: dict) -> dict:
    """A saved config (a run directory's config.yaml as a dict) on today's keys: one written with the flat keys
    before the groups is moved into them; one written since is returned as it is."""
    if not any(key in saved and not isinstance(saved[key], dict) for key in RENAMED):
        return saved
    moved: dict = {}
    for key, value in saved.items():
        group, _, name = RENAMED.get(key, key).rpartition(".")
        (moved.setdefault(group, {}) if group else moved)[name] = value
    return moved


EVAL_SEED_OFFSET = 100_000  # the evaluation environment's seed: the run's plus this, apart from training's stream
MAX_SEED = 2**32 - 1 - EVAL_SEED_OFFSET  # NumPy's and MuJoCo's seeds are 32-bit
