"""Typed run configuration with the paper's defaults (appendix C, table 1).

Units: every `*_frames` value counts environment frames; an agent step is `action_repeat` frames.
The Hydra YAML files in `protorl/conf/` build on this schema; `validate` checks values at start-up.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from omegaconf import MISSING


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the accepted values."""


@dataclass
class AgentConfig:
    """Proto-RL and SAC hyper-parameters (table 1 of the paper), plus each baseline's own constants."""

    name: str = "proto"  # which agent: one of protorl.agents.AGENT_NAMES (set with `agent=NAME`)
    lr: float = 1e-4
    batch_size: int = 512
    discount: float = 0.99
    # SAC (appendix C.4)
    feature_dim: int = 50  # trunk Linear(repr -> 50) + LayerNorm
    hidden_dim: int = 1024
    hidden_depth: int = 2
    init_temperature: float = 0.1
    log_std_min: float = -10.0
    log_std_max: float = 2.0
    actor_update_every: int = 2  # the table says 2, the text of C.4 says 1: we follow the table
    critic_target_update_every: int = 2
    critic_target_tau: float = 0.01
    # Prototypical representation (appendix C.2)
    proj_dim: int = 128
    pred_hidden_dim: int = 512
    num_prototypes: int = 512
    temperature: float = 0.1  # softmax temperature tau
    sinkhorn_iters: int = 3
    ssl_update_every: int = 1  # an L_SSL step every N agent updates (the paper's text: 1; its code: 2)
    encoder_target_update_every: int = 2
    encoder_target_tau: float = 0.05
    # between the linear projector and the L2 normalisation: "none" (the paper), or a departure that keeps
    # the projections from collapsing, "center" (subtract the mean) or "batchnorm" (protorl/proto.py, Projector)
    anti_collapse: str = "none"
    anti_collapse_momentum: float = 0.1  # of its running statistics (BatchNorm's default)
    augment_pad: int = 4  # random shift of +-4 pixels; 0 disables augmentation
    # Entropy-based intrinsic reward (appendix C.3)
    candidates_per_prototype: int = 4  # T: queue size is num_prototypes * T
    knn_k: int = 3
    # false (the paper): enqueue a batch's candidates, then score it, so at small batches a frame's k nearest
    # include copies of itself; true: score against the candidates of earlier batches, then enqueue
    reward_before_enqueue: bool = False
    # where the k-NN distances are measured: "sphere" (the paper: L2-normalised projections) or "raw" (the
    # projections before L2 normalisation over their running RMS spread; needed with anti_collapse != none)
    reward_space: str = "sphere"
    intr_coef: float = 0.2  # downstream alpha in r + alpha * r_intr
    # State encoder used when env.obs == "states" (replaces the conv encoder)
    state_hidden_dim: int = 256
    # Curiosity baseline (ICM, appendix C.4)
    icm_proj_dim: int = 50  # linear projection of the encoder's features
    icm_hidden_dim: int = 1024  # forward and inverse models: 2-layer MLPs with ReLU
    # APT baseline (Liu and Abbeel 2021)
    apt_proj_dim: int = 128  # contrastive projection head: Linear -> ReLU -> Linear
    apt_temperature: float = 0.5  # NT-Xent temperature (SimCLR's default)
    apt_knn_k: int = 12  # neighbours averaged in the particle-based reward, within the batch


@dataclass
class Config:
    """One run: which phase, on which task, for how long, and where its outputs go."""

    env: str = "point_mass_easy"  # task the agent is evaluated and fine-tuned on (`domain_task`)
    pretrain_env: str | None = None  # task-agnostic phase task; None: same as `env` (its reward is hidden)
    snapshot: str | None = None  # finetune: path of the pre-training snapshot to start from
    # downstream tasks of one pre-training (protorl-train, protorl-finetune), each in its own
    # `finetune_<task>/` directory; empty: `env` alone, in `finetune/`
    finetune_envs: list[str] = field(default_factory=list)
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
    replay_capacity: int = 100_000  # transitions
    update_every_steps: int = 1  # one agent update per agent step
    eval_every_frames: int = 10_000
    eval_episodes: int = 10
    eval_during_pretrain: bool = False
    snapshot_at_frames: list[int] = field(default_factory=lambda: [100_000, 200_000, 500_000, 1_000_000])
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
    threads: int | None = None  # torch intra-op threads; None leaves torch's default (one per core)
    fast_malloc: bool = True  # keep large tensors off glibc's mmap path (see protorl.utils.tune_malloc)
    # Pre-training analyses (protorl/analysis/): state coverage, maze maps, k-NN reward variance
    analysis_every_frames: int | None = 50_000  # also once at the end of pre-training; None: no analyses
    coverage_bins: int = 20  # bins per coverage coordinate (e.g. 20 x 20 cells of the maze's x, y)
    random_reference: bool = True  # also report the coverage of a uniform-random policy over the same frames
    variance_probes: int = 128  # probe states whose reward variance is measured, drawn once from the replay
    variance_repeats: int = 10  # candidate sets drawn per scheme (proto, uniform) and analysis
    map_samples: int = 2048  # replay observations encoded to place each prototype on the maze map
    run_dir: str = MISSING  # set by the YAML files to Hydra's output directory
    agent: AgentConfig = field(default_factory=AgentConfig)


EVAL_SEED_OFFSET = 100_000  # the evaluation environment's seed: the run's plus this, apart from training's stream
MAX_SEED = 2**32 - 1 - EVAL_SEED_OFFSET  # NumPy's and MuJoCo's seeds are 32-bit

_POSITIVE_INTS = {
    "finetune_frames", "replay_capacity", "update_every_steps",
    "eval_every_frames", "log_every_episodes", "video_size",
}
_POSITIVE_AGENT_INTS = {
    "batch_size", "feature_dim", "hidden_dim", "hidden_depth", "actor_update_every",
    "critic_target_update_every", "proj_dim", "pred_hidden_dim", "num_prototypes", "sinkhorn_iters",
    "encoder_target_update_every", "ssl_update_every", "candidates_per_prototype", "knn_k", "state_hidden_dim",
    "icm_proj_dim", "icm_hidden_dim", "apt_proj_dim", "apt_knn_k",
}
_UNIT_INTERVAL_AGENT = {"discount", "critic_target_tau", "encoder_target_tau", "anti_collapse_momentum"}


def validate(cfg: Config, command: str) -> None:
    """Raise `ConfigError` naming the first invalid value; called before anything is built or written.

    `command`: "pretrain", "finetune" or "train" (both phases).
    """
    from protorl.agents import AGENTS  # imported here: the agents import this module
    from protorl.envs import check_task, split_task  # imported here: listing tasks imports dm_control

    def fail(key: str, value, expected: str) -> None:
        raise ConfigError(f"invalid config value {key}={value!r}: expected {expected}")

    for key, value in _float_values(cfg):
        if not math.isfinite(value):
            fail(key, value, "a finite number")
    if not 0 <= cfg.seed <= MAX_SEED:
        fail("seed", cfg.seed, f"an integer in [0, {MAX_SEED}] (seeds are 32-bit; evaluation uses seed + "
             f"{EVAL_SEED_OFFSET})")
    for key in sorted(_POSITIVE_INTS):
        if getattr(cfg, key) <= 0:
            fail(key, getattr(cfg, key), "a positive integer")
    for key in sorted(_POSITIVE_AGENT_INTS):
        if getattr(cfg.agent, key) <= 0:
            fail(f"agent.{key}", getattr(cfg.agent, key), "a positive integer")
    for key in sorted(_UNIT_INTERVAL_AGENT):
        value = getattr(cfg.agent, key)
        if not 0.0 < value <= 1.0:
            fail(f"agent.{key}", value, "a number in (0, 1]")
    if cfg.agent.name not in AGENTS:
        fail("agent", cfg.agent.name, f"one of {', '.join(AGENTS)} (set with agent=NAME)")
    agent = AGENTS[cfg.agent.name]
    if cfg.pretrain_frames < 0 or (command == "pretrain" and cfg.pretrain_frames == 0):
        fail("pretrain_frames", cfg.pretrain_frames, "a positive integer (0 only with protorl-train: no pre-training)")
    if command == "pretrain" and not agent.pretrains:
        fail("agent", agent.name, "an agent with a task-agnostic phase: DrQ learns from the task reward only "
             "(run it with protorl-train or protorl-finetune)")
    if command == "train" and agent.pretrains and cfg.pretrain_frames == 0 and not agent.learns_online:
        fail("pretrain_frames", 0, f"a positive integer: agent={agent.name} learns its representation only "
             "in pre-training (agents without pre-training: "
             f"{', '.join(name for name, a in AGENTS.items() if a.learns_online)})")
    if agent.name == "apt" and cfg.agent.apt_knn_k >= cfg.agent.batch_size:
        fail("agent.apt_knn_k", cfg.agent.apt_knn_k, f"less than agent.batch_size={cfg.agent.batch_size} "
             "(the neighbours come from the same batch)")
    if not cfg.agent.apt_temperature > 0:
        fail("agent.apt_temperature", cfg.agent.apt_temperature, "a positive number")
    from protorl.proto import ANTI_COLLAPSE, REWARD_SPACES

    if cfg.agent.anti_collapse not in ANTI_COLLAPSE:
        fail("agent.anti_collapse", cfg.agent.anti_collapse, f"one of {', '.join(ANTI_COLLAPSE)}")
    if cfg.agent.reward_space not in REWARD_SPACES:
        fail("agent.reward_space", cfg.agent.reward_space, f"one of {', '.join(REWARD_SPACES)}")
    if cfg.agent.anti_collapse == "batchnorm" and cfg.agent.batch_size < 2:
        fail("agent.batch_size", cfg.agent.batch_size, "at least 2 with agent.anti_collapse=batchnorm")
    if cfg.agent.lr <= 0:
        fail("agent.lr", cfg.agent.lr, "a positive number")
    if cfg.agent.temperature <= 0 or cfg.agent.init_temperature <= 0:
        fail("agent.temperature/init_temperature", (cfg.agent.temperature, cfg.agent.init_temperature),
             "positive numbers")
    if cfg.agent.intr_coef < 0:
        fail("agent.intr_coef", cfg.agent.intr_coef, "a number >= 0")
    if cfg.agent.augment_pad < 0:
        fail("agent.augment_pad", cfg.agent.augment_pad, "an integer >= 0")
    if cfg.agent.log_std_min >= cfg.agent.log_std_max:
        fail("agent.log_std_min", cfg.agent.log_std_min, f"less than agent.log_std_max={cfg.agent.log_std_max}")
    if cfg.agent.knn_k > cfg.agent.num_prototypes:
        fail("agent.knn_k", cfg.agent.knn_k, f"at most agent.num_prototypes={cfg.agent.num_prototypes} "
             "(the candidates in the queue after the first update)")
    if cfg.seed_transitions < 0:
        fail("seed_transitions", cfg.seed_transitions, "an integer >= 0")
    if cfg.eval_episodes < 0:
        fail("eval_episodes", cfg.eval_episodes, "an integer >= 0")
    if cfg.checkpoint_every_frames is not None and cfg.checkpoint_every_frames <= 0:
        fail("checkpoint_every_frames", cfg.checkpoint_every_frames, "a positive frame count or null")
    if cfg.checkpoint_every_minutes is not None and cfg.checkpoint_every_minutes <= 0:
        fail("checkpoint_every_minutes", cfg.checkpoint_every_minutes, "a positive number of minutes or null")
    if cfg.checkpoint_keep <= 0:
        fail("checkpoint_keep", cfg.checkpoint_keep, "a positive integer")
    if cfg.analysis_every_frames is not None and cfg.analysis_every_frames <= 0:
        fail("analysis_every_frames", cfg.analysis_every_frames, "a positive frame count or null")
    if cfg.coverage_bins < 2:
        fail("coverage_bins", cfg.coverage_bins, "an integer >= 2")
    if cfg.variance_repeats < 2:
        fail("variance_repeats", cfg.variance_repeats, "an integer >= 2 (a spread needs two draws)")
    for key in ("variance_probes", "map_samples"):
        if getattr(cfg, key) <= 0:
            fail(key, getattr(cfg, key), "a positive integer")
    if cfg.wandb:
        from protorl.tracking import wandb_available

        if not wandb_available():
            fail("wandb", True, "false, or install the wandb package first: pip install -e \".[wandb]\"")
    if cfg.threads is not None and cfg.threads <= 0:
        fail("threads", cfg.threads, "a positive integer or null")
    if any(f <= 0 for f in cfg.snapshot_at_frames):
        fail("snapshot_at_frames", list(cfg.snapshot_at_frames), "a list of positive frame counts")
    if cfg.device != "auto" and not (cfg.device == "cpu" or cfg.device.startswith("cuda")):
        fail("device", cfg.device, "'auto', 'cpu' or 'cuda[:N]'")
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            fail("device", cfg.device, "'auto' or 'cpu': CUDA is not available on this machine")

    if cfg.obs not in ("pixels", "states"):
        fail("obs", cfg.obs, "'pixels' or 'states'")
    for key in ("image_size", "frame_stack", "action_repeat"):
        if getattr(cfg, key) <= 0:
            fail(key, getattr(cfg, key), "a positive integer")
    if cfg.obs == "pixels" and cfg.image_size < 15:
        fail("image_size", cfg.image_size, "at least 15 pixels (the 4-layer conv encoder needs a 1x1 output)")

    check_task(cfg.env)
    if cfg.pretrain_env is not None:
        check_task(cfg.pretrain_env)
    for task in cfg.finetune_envs:
        check_task(task)
    frame_stack = cfg.frame_stack if cfg.obs == "pixels" else 1
    if cfg.replay_capacity <= frame_stack:
        fail("replay_capacity", cfg.replay_capacity, f"more than the frame stack ({frame_stack}): a transition "
             "needs its stacks in the buffer")
    phases = {"pretrain_frames": command != "finetune" and agent.pretrains and cfg.pretrain_frames > 0,
              "finetune_frames": command != "pretrain"}
    for key in (key for key, runs in phases.items() if runs):
        if getattr(cfg, key) // cfg.action_repeat <= cfg.seed_transitions:
            fail(key, getattr(cfg, key), f"more than seed_transitions={cfg.seed_transitions} agent steps of "
                 f"action_repeat={cfg.action_repeat} frames each: no agent update would run")
    if cfg.camera_id is not None:
        _check_camera(cfg, [cfg.env, *([cfg.pretrain_env] if cfg.pretrain_env else []), *cfg.finetune_envs])
    if len(set(cfg.finetune_envs)) != len(cfg.finetune_envs):
        fail("finetune_envs", list(cfg.finetune_envs), "a list of distinct task names")
    if command == "train" and agent.pretrains and cfg.pretrain_frames > 0:
        pretrain_domain = split_task(cfg.pretrain_env or cfg.env)[0]
        other = [task for task in downstream_tasks(cfg) if split_task(task)[0] != pretrain_domain]
        if other:
            raise ConfigError(f"downstream task(s) {', '.join(other)} are not of the pre-training task's domain "
                              f"{pretrain_domain!r}: a snapshot serves the tasks of its own domain only")
    if command == "finetune" and not cfg.snapshot and agent.pretrains:
        raise ConfigError("finetune needs a pre-training snapshot: add snapshot=/path/to/snapshot.pt "
                          "(or run protorl-train pretrain_frames=0 to learn without pre-training)")


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
    from protorl.envs import make_env

    for task in tasks:
        cameras = make_env(task, cfg, seed=0).num_cameras
        if not 0 <= cfg.camera_id < cameras:
            raise ConfigError(f"invalid config value camera_id={cfg.camera_id!r}: task {task} has cameras 0 to "
                              f"{cameras - 1}")


def downstream_tasks(cfg: Config) -> list[str]:
    """The tasks fine-tuned after one pre-training: `finetune_envs`, or `env` alone."""
    return list(cfg.finetune_envs) or [cfg.env]


def downstream_dir_name(cfg: Config, task: str) -> str:
    """`finetune` for a single downstream task (`env`), else `finetune_<task>`."""
    return f"finetune_{task}" if cfg.finetune_envs else "finetune"
