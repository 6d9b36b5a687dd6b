"""The files and folders of a run directory, named in one place.

    <run_dir>/config.yaml                 the settings the run was made with
    <run_dir>/pretrain/                   the task-agnostic phase (train.csv, analysis.csv, snapshots/, result.json)
    <run_dir>/finetune/                   the downstream phase on `task`, or, with `finetune_tasks`,
    <run_dir>/finetune_<task>/            one per downstream task
    <run_dir>/finetune_scratch_<task>/    the same task without pre-training (`compare_without_pretraining`)

A phase directory holds `result.json` once the phase has completed.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from protorl.config import Config, grouped

CONFIG_FILE = "config.yaml"
RESULT_FILE = "result.json"
SWEEP_INDEX_FILE = "index.csv"  # a sweep directory's: one row per job (protorl.app.sweep)
SETTINGS_KEY = "settings"  # a checkpoint's and a result record's: the run's settings, dotted (rundir.run_settings)
SNAPSHOT_DIGESTS_KEY = "snapshot_digests"  # a result record's: the digest of each snapshot it lists
PRETRAIN_DIR = "pretrain"
DOWNSTREAM_DIR = "finetune"
SCRATCH_PREFIX = "scratch_"  # the task name a fine-tuning without pre-training is recorded under: scratch_<task>


def downstream_dir_name(config: Config, task: str) -> str:
    """`finetune` for a single downstream task (`task`), else `finetune_<task>`."""
    return f"{DOWNSTREAM_DIR}_{task}" if config.finetune_tasks else DOWNSTREAM_DIR


def read_run_config(path: Path) -> DictConfig:
    """A run directory's config.yaml (at `path`) on today's keys: one written before the settings were grouped has
    its flat keys moved into the groups (`protorl.config.grouped`)."""
    return OmegaConf.create(grouped(OmegaConf.to_container(OmegaConf.load(path))))


def scratch_dir_name(task: str) -> str:
    """`finetune_scratch_<task>`: the fine-tuning of `task` without pre-training (`compare_without_pretraining`)."""
    return f"{DOWNSTREAM_DIR}_{SCRATCH_PREFIX}{task}"


def is_downstream_dir(path: Path) -> bool:
    """Whether `path` is a downstream phase's directory: `finetune/` or `finetune_<name>/`."""
    return path.is_dir() and (path.name == DOWNSTREAM_DIR or path.name.startswith(f"{DOWNSTREAM_DIR}_"))


def downstream_dirs(run_dir: Path) -> list[Path]:
    """The run's downstream phase directories, in name order."""
    return sorted(path for path in run_dir.glob(f"{DOWNSTREAM_DIR}*") if is_downstream_dir(path))


def phase_dirs(run_dir: Path) -> list[Path]:
    """The run's phase directories: `pretrain/` if there is one, then the downstream ones."""
    pretrain = run_dir / PRETRAIN_DIR
    return ([pretrain] if pretrain.is_dir() else []) + downstream_dirs(run_dir)


def downstream_name(phase: Path, env: str) -> str:
    """What a downstream directory was fine-tuned on: `task` for `finetune/`, else the name after `finetune_` (a
    task, or `scratch_<task>` without pre-training)."""
    return env if phase.name == DOWNSTREAM_DIR else phase.name.removeprefix(f"{DOWNSTREAM_DIR}_")


def is_complete(phase: Path) -> bool:
    """Whether the phase in `phase` has completed (its `result.json` is there)."""
    return (phase / RESULT_FILE).is_file()
