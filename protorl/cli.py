"""Command-line entry points (Hydra): protorl-pretrain, protorl-finetune, protorl-train, protorl-tasks;
protorl-analyze (argparse).

    protorl-train                                   # small CPU preset on cartpole_balance, both phases
    protorl-train preset=paper env=walker_run       # the paper's 500k + 500k frames
    protorl-pretrain env=walker_walk seed=3
    protorl-finetune env=walker_run snapshot=runs/.../pretrain/snapshots/snapshot_500000.pt
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from protorl.config import Config, ConfigError, downstream_dir_name, downstream_tasks, validate

log = logging.getLogger("protorl")
ConfigStore.instance().store(name="protorl_schema", node=Config)


def checked_config(cfg: DictConfig, command: str) -> tuple[Config, dict | None]:
    """The validated typed config and, for finetune, its checked snapshot; user errors exit with status 2."""
    from protorl.envs import make_env
    from protorl.snapshot import SnapshotError, load_snapshot

    pretrained = None
    try:
        config: Config = OmegaConf.to_object(cfg)
        validate(config, command)
        if command == "finetune" and config.snapshot:  # refuse a missing or mismatched snapshot before any work
            for task in downstream_tasks(config):
                pretrained = load_snapshot(config.snapshot, env_spec=make_env(task, config, seed=0).spec(),
                                           agent_config=config.agent)
    except (ConfigError, SnapshotError, ValueError, OmegaConfBaseException) as error:
        _exit_with(error)
    return config, pretrained


class ValidateBeforeRun(Callback):
    """Hydra callback: check the config before Hydra creates the run directory, so a typo writes nothing."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        keys = [key for key in config if key not in ("hydra", "run_dir")]
        user_config = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.masked_copy(config, keys),
                                      {"run_dir": "."})
        checked_config(user_config, config.hydra.job.name)


def run(cfg: DictConfig, command: str) -> None:
    """Validate the config, then run the phases of `command`; user errors exit with status 2."""
    from protorl.agents import AGENTS
    from protorl.checkpoint import CheckpointError
    from protorl.report import plot_curves, summary
    from protorl.snapshot import SnapshotError, load_snapshot
    from protorl.tracking import finish_run, start_run
    from protorl.training import TrainingDiverged, prepare_process

    config, pretrained = checked_config(cfg, command)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.structured(config), run_dir / "config.yaml")
    device = prepare_process(config)
    log.info("run directory %s, device %s", run_dir, device)
    wandb_run = start_run(config, run_dir)

    results = []
    pretrains = AGENTS[config.agent.name].pretrains and config.pretrain_frames > 0
    if command == "train" and not pretrains:
        log.info("no pre-training (agent=%s, pretrain_frames=%d): the downstream agent learns its "
                 "representation from the task reward", config.agent.name, config.pretrain_frames)
    try:
        if command == "pretrain" or (command == "train" and pretrains):
            pretrain_task = config.pretrain_env or config.env
            results.append(run_phase(config, "pretrain", pretrain_task, run_dir / "pretrain"))
        if command == "train" and pretrains:  # fine-tune from the file just written, as protorl-finetune would
            pretrained = load_snapshot(results[-1].snapshots[-1])
        if command in ("finetune", "train"):
            for task in downstream_tasks(config):  # one snapshot, each downstream task from scratch
                results.append(run_phase(config, "finetune", task, run_dir / downstream_dir_name(config, task),
                                         pretrained))
    except (SnapshotError, CheckpointError) as error:
        _exit_with(error)
    except TrainingDiverged as error:
        _exit_with(error, status=3)
    finally:
        finish_run(wandb_run)
    plot = plot_curves(results, run_dir / "curves.png")
    print(summary(results, plot), flush=True)
    if (run_dir / "pretrain" / "analysis.csv").is_file():  # what protorl-analyze RUN_DIR prints and plots
        from protorl.analysis.report import analyze_run

        print(analyze_run(run_dir), flush=True)


def run_phase(config: Config, phase: str, task: str, out_dir: Path, pretrained: dict | None = None):
    """Run one phase; with `resume`, skip it if complete or continue from its last checkpoint."""
    from protorl.training import PhaseResult, Trainer

    if config.resume:
        done = PhaseResult.load(out_dir)
        if done is not None:
            log.info("%s already complete in %s", phase, out_dir)
            return done
    trainer = Trainer(config, phase, task, out_dir, pretrained)
    if config.resume:
        checkpoint = trainer.resume_from_latest()
        if checkpoint is not None:
            log.info("resuming %s from %s (frame %d)", phase, checkpoint, trainer.frames)
    return trainer.run()


def _exit_with(error: Exception, status: int = 2) -> None:
    print(f"protorl: error: {error}", file=sys.stderr, flush=True)
    sys.exit(status)


def run_job(cfg: DictConfig, command: str) -> None:
    """`run`; in a sweep (-m), a job that stops with an error leaves its phases incomplete and lets the
    other jobs run (the sweep's index lists it and the sweep exits non-zero)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        run(cfg, command)
    except SystemExit as stop:
        if not stop.code or HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        log.error("job %s stopped (exit status %s); the sweep goes on", HydraConfig.get().job.num, stop.code)


@hydra.main(version_base="1.3", config_path="conf", config_name="pretrain")
def pretrain(cfg: DictConfig) -> None:
    """Task-agnostic pre-training; writes snapshots for `protorl-finetune`."""
    run_job(cfg, "pretrain")


@hydra.main(version_base="1.3", config_path="conf", config_name="finetune")
def finetune(cfg: DictConfig) -> None:
    """Downstream RL on a frozen pre-trained representation (needs snapshot=PATH)."""
    run_job(cfg, "finetune")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def train(cfg: DictConfig) -> None:
    """Pre-training then fine-tuning on `env`, as in the paper's protocol."""
    run_job(cfg, "train")


def tasks() -> None:
    """Print every task name accepted by `env=`."""
    from protorl.envs import list_tasks

    print("\n".join(list_tasks()))


def analyze(argv: list[str] | None = None) -> None:
    """protorl-analyze RUN_DIR: coverage and reward-variance plots and a text summary of a run's pre-training."""
    import argparse

    from protorl.analysis.report import NotARunError, analyze_run

    parser = argparse.ArgumentParser(prog="protorl-analyze", description=analyze.__doc__)
    parser.add_argument("run_dir", type=Path, help="a run directory (holding pretrain/analysis.csv)")
    args = parser.parse_args(argv)
    try:
        print(analyze_run(args.run_dir), flush=True)
    except NotARunError as error:
        _exit_with(error)


def aggregate(argv: list[str] | None = None) -> None:
    """protorl-aggregate PATH [PATH ...]: learning curves, final-score tables and rliable statistics (IQM,
    mean, median, optimality gap, performance profiles) over the downstream phases of runs and sweeps."""
    import argparse

    from protorl.analysis.aggregate import RETURN, AggregateError, aggregate_runs, pretraining_metric

    parser = argparse.ArgumentParser(prog="protorl-aggregate", description=aggregate.__doc__)
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="run directories (holding config.yaml) or sweep directories holding them")
    parser.add_argument("--out", type=Path, default=Path("aggregate"), help="output directory (default: aggregate)")
    parser.add_argument("--group-by", nargs="+", default=["agent.name"], metavar="KEY",
                        help="dotted config keys whose values label a method (default: agent.name); "
                             "'agent': the agent config chosen, e.g. proto_paper vs proto")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap replications (default: 2000)")
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the bootstrap (default: 0)")
    parser.add_argument("--metric", default=None, metavar="COLUMN",
                        help="a column of pretrain/analysis.csv instead of the downstream return, e.g. "
                             "coverage/entropy (figure 9) or variance/proto_cv (figure 10)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    metric = RETURN if args.metric is None else pretraining_metric(args.metric)
    try:
        print(aggregate_runs(args.paths, args.out, args.group_by, args.reps, args.seed, metric), flush=True)
    except AggregateError as error:
        _exit_with(error)
