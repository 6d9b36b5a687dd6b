"""Typed run configuration with the paper's defaults (appendix C, table 1).

Units: every `*_frames` value counts environment frames; an agent step is `action_repeat` frames.
The Hydra YAML files in `protorl/conf/` build on this schema; `protorl.app.validate` checks values at start-up.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field

from omegaconf import MISSING

from protorl.errors import ConfigError

__all__ = ["EVAL_SEED_OFFSET", "MAX_SEED", "AgentConfig", "Config", "ConfigError",
           "downstream_tasks", "in_unit_interval", "invalid", "positive"]


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
    feature_dim: int = 50  # trunk Linear(repr -> 50) + LayerNorm
    hidden_dim: int = 1024
    hidden_depth: int = 2
    init_temperature: float = 0.1  # SAC's entropy temperature at the start
    log_std_min: float = -10.0
    log_std_max: float = 2.0
    actor_update_every: int = 2  # the table says 2, the text of C.4 says 1: we follow the table
    critic_target_update_every: int = 2
    critic_target_tau: float = 0.01  # EMA rate of the critic's target
    augment_pad: int = 4  # random shift of +-4 pixels; 0 disables augmentation
    state_hidden_dim: int = 256  # the encoder used when env.obs == "states" (replaces the conv encoder)
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
class Config:
    """One run: which phase, on which task, for how long, and where its outputs go."""

    env: str = "point_mass_easy"  # task the agent is evaluated and fine-tuned on (`domain_task`)
    pretrain_env: str | None = None  # task-agnostic phase task; None: same as `env` (its reward is hidden)
    snapshot: str | None = None  # finetune: path of the pre-training snapshot to start from
    # finetune without `snapshot`: a pre-training sweep's directory; the snapshot is its run's of this agent, task
    # (`pretrain_env` or `env`) and seed, at `pretrain_frames` (protorl/storage/snapshots.py)
    pretrain_sweep: str | None = None
    # set by the commands: the digest the snapshot was written with (the SHA-256 of its content; of the whole file
    # for one written before digests existed), which identifies it wherever it lives (a run directory continues
    # from a snapshot moved elsewhere, and refuses another one at the same path, or this one changed)
    snapshot_sha256: str | None = None
    # downstream tasks of one pre-training (protorl-train, protorl-finetune), each in its own
    # `finetune_<task>/` directory; empty: `env` alone, in `finetune/`
    finetune_envs: list[str] = field(default_factory=list)
    # also fine-tune each downstream task without pre-training, the same frames, in `finetune_scratch_<task>/`:
    # the agent's online mode (Proto-RL: appendix H), for the comparison that shows what pre-training bought
    compare_without_pretraining: bool = False
    # a line printed under that comparison: what one seed of these settings can show (the main job's: measured on
    # seeds it was not chosen on, docs/results/main-job.md); None: no line
    comparison_note: str | None = None
    seed: int = 1
    device: str = "auto"  # auto: CUDA when available, else CPU
    # how the task is observed (appendix C.1)
    obs: str = "pixels"  # "pixels" (stacked RGB frames) or "states" (the suite's proprioceptive vector)
    image_size: int = 84
    frame_stack: int = 3  # pixels only; state observations are not stacked
    action_repeat: int = 2
    camera_id: int | None = None  # None: camera 2 for quadruped, camera 0 otherwise
    pretrain_frames: int = 500_000  # 0 (protorl-train only): no pre-training, learn online from the task reward
    finetune_frames: int = 500_000
    seed_transitions: int = 1000  # agent steps of a uniform-random policy before updates start
    replay_capacity: int = 100_000  # stored agent steps (slots): each episode's first frame takes one too
    # also keep the replay's frames in the accelerator's memory and sample there (a 100k-frame pixel buffer is
    # ~2 GB); None: when the device is CUDA and they take under half its free memory
    replay_on_device: bool | None = None
    update_every_steps: int = 1  # one agent update per agent step
    updates_per_step: int = 1  # agent updates at each updating step (the update-to-data ratio; the paper: 1)
    # step the training environment on a thread of its own while the agent updates: the same results. Off by
    # default: on a 2-core CPU its thread slows torch's down (docs/benchmarks/index.md); not yet measured on a GPU
    overlap_env_step: bool = False
    eval_every_frames: int = 10_000
    eval_episodes: int = 10
    eval_during_pretrain: bool = False
    snapshot_at_frames: list[int] = field(default_factory=lambda: [100_000, 200_000, 500_000, 1_000_000])
    # Fine-tuning on the pre-training's data, a departure from the paper (docs/finetuning.md). `snapshot_replay`:
    # pre-training snapshots also hold the replay buffer with each frame's physical state (per 100k frames: the
    # U-maze from states 3.6 MB, 84x84 pixels ~1 GB). `pretrain_data_share`: this share of every fine-tuning batch
    # comes from the snapshot's replay, its rewards relabelled for the downstream task; 0: the paper
    snapshot_replay: bool = False
    pretrain_data_share: float = 0.0
    checkpoint_every_frames: int | None = 100_000  # full training state, at the next episode end; None: never
    checkpoint_every_minutes: float | None = None  # also checkpoint when this much wall time has passed
    checkpoint_keep: int = 2  # newest checkpoints kept per phase
    resume: bool = True  # continue the run already in `run_dir` (same settings); false: refuse such a directory
    start_over: bool = False  # delete the run data already in `run_dir` and start again
    keep_checkpoints: bool = False  # keep a phase's checkpoints once it has completed (else they are deleted)
    log_every_episodes: int = 1
    save_video: bool = False
    video_size: int = 256
    tensorboard: bool = True
    wandb: bool = False  # also log to Weights & Biases (needs `pip install -e ".[wandb]"`)
    wandb_project: str = "protorl"
    wandb_entity: str | None = None  # None: your default W&B entity
    wandb_group: str | None = None  # e.g. one group per sweep
    progress_bar: bool = True
    # refuse a run whose wall time, estimated on this machine before it starts (protorl/app/duration.py), exceeds this
    # many hours; null: no limit
    max_hours: float | None = 24.0
    threads: int | None = None  # torch intra-op threads; None leaves torch's default (one per core)
    fast_malloc: bool = True  # keep large tensors off glibc's mmap path (see protorl.runtime.tune_malloc)
    cudnn_benchmark: bool = True  # CUDA: cuDNN picks its fastest convolutions for the run's fixed shapes
    # Pre-training analyses (protorl/exploration/): state coverage, maze maps, k-NN reward variance, state probe
    analysis_every_frames: int | None = 50_000  # also once at the end of pre-training; None: no analyses
    coverage_bins: int = 20  # bins per coverage coordinate (e.g. 20 x 20 cells of the maze's x, y)
    random_reference: bool = True  # also report the coverage of a uniform-random policy over the same frames
    variance_probes: int = 128  # probe states whose reward variance is measured, drawn once from the replay
    variance_repeats: int = 10  # candidate sets drawn per scheme (proto, uniform) and analysis
    map_samples: int = 2048  # replay observations encoded to place each prototype on the maze map
    # the analyses also probe the encoder (docs/probe.md) on this many uniform-random frames; None: not
    probe_samples: int | None = None
    run_dir: str = MISSING  # set by the YAML files to Hydra's output directory
    agent: AgentConfig = field(default_factory=AgentConfig)  # the chosen agent's subclass (`agent=NAME`)


EVAL_SEED_OFFSET = 100_000  # the evaluation environment's seed: the run's plus this, apart from training's stream
MAX_SEED = 2**32 - 1 - EVAL_SEED_OFFSET  # NumPy's and MuJoCo's seeds are 32-bit

def downstream_tasks(cfg: Config) -> list[str]:
    """The tasks fine-tuned after one pre-training: `finetune_envs`, or `env` alone."""
    return list(cfg.finetune_envs) or [cfg.env]


def runs_analyses(cfg: Config, phase: str) -> bool:
    """Whether `phase` ("pretrain" or "finetune") runs the exploration analyses: pre-training with
    `analysis_every_frames`."""
    return phase == "pretrain" and cfg.analysis_every_frames is not None


def keeps_physical_states(cfg: Config, phase: str) -> bool:
    """Whether the replay buffer of `phase` keeps every frame's physical state: for the analyses, or for a
    snapshot's replay (`snapshot_replay`), which fine-tuning relabels with a task's reward."""
    return runs_analyses(cfg, phase) or (phase == "pretrain" and cfg.snapshot_replay)


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def type_errors(config, prefix: str = "") -> list[tuple[str, object, str]]:
    """(key, value, what it should be) for every field of the dataclass `config` (nested ones too) whose value is
    not of its declared type: what the command line's parser refuses, refused from Python too."""
    errors = []
    hints = typing.get_type_hints(type(config))
    for item in dataclasses.fields(config):
        value, declared, key = getattr(config, item.name), hints[item.name], f"{prefix}{item.name}"
        if value is MISSING:
            continue
        if dataclasses.is_dataclass(declared):
            errors += (type_errors(value, f"{key}.") if dataclasses.is_dataclass(value) else
                       [(key, value, f"an instance of {declared.__name__} (e.g. the agent's own config class)")])
            continue
        options = typing.get_args(declared) if typing.get_origin(declared) is types.UnionType else (declared,)
        if value is None and type(None) in options:
            continue
        kinds = [t for t in options if t is not type(None)]
        if not any(_is_a(value, kind) for kind in kinds):
            names = [_TYPE_NAMES[kind] if kind in _TYPE_NAMES else f"a list of {typing.get_args(kind)[0].__name__}"
                     for kind in kinds]
            errors.append((key, value, " or ".join(names + (["null"] if type(None) in options else []))))
    return errors


def _is_a(value, kind) -> bool:
    if typing.get_origin(kind) is list:
        item = typing.get_args(kind)[0]
        return isinstance(value, (list, tuple)) and all(_is_a(v, item) for v in value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)
