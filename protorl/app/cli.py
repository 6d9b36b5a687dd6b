"""Command-line entry points: protorl-pretrain, protorl-finetune, protorl-train (Hydra); protorl-tasks;
protorl-analyze, protorl-probe, protorl-aggregate (argparse).

    protorl-train                                   # the main job (preset=demo): the U-maze from states
    protorl-train preset=paper env=walker_run       # the paper's 500k + 500k frames
    protorl-pretrain env=walker_walk seed=3
    protorl-finetune env=walker_run snapshot=runs/.../pretrain/snapshots/snapshot_500000.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import math
import os
import sys
import typing
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from protorl.agents import BUILT_IN, registered_agents
from protorl.config import Config, ConfigError
from protorl.errors import ProtorlError, did_you_mean

log = logging.getLogger("protorl")
_USER_ERRORS = (ProtorlError, ValueError, OmegaConfBaseException)  # a config the user can fix
_JOB_ERRORS_SHOWN = 5  # a sweep's refused jobs listed one per line, up to this many
# what MuJoCo's and PyOpenGL's imports log at INFO (the backend tried, the library version) is not the run's news
for _library in ("absl", "OpenGL"):
    logging.getLogger(_library).setLevel(logging.WARNING)
ConfigStore.instance().store(name="protorl_schema", node=Config)
for _name, _agent in registered_agents().items():  # each agent's YAML (conf/agent/) builds on its config class
    ConfigStore.instance().store(group="agent_schema", name=_name, node=_agent.config_class)
    if _name not in BUILT_IN:  # an agent from another package: its config class's defaults are its YAML
        ConfigStore.instance().store(group="agent", name=_name, node=_agent.config_class)


def checked_config(cfg: DictConfig, command: str, overrides: Sequence[str] = ()) -> tuple[Config, dict | None]:
    """The validated typed config and, for finetune, its checked snapshot; user errors exit with status 2.

    `cfg`: the composed config without Hydra's node; a key the schema does not know (e.g. added with `+`)
    is refused, not dropped. `overrides`: the command line's; an `env` named there must be a task of the run.
    """
    try:
        return _checked(cfg, command, overrides)
    except _USER_ERRORS as error:
        _exit_with(_one_line(error))


def _checked(cfg: DictConfig, command: str, overrides: Sequence[str],
             resources: bool = True) -> tuple[Config, dict | None]:
    from protorl.app.commands import check

    unknown = _unknown_keys(cfg, Config)
    if unknown:  # Hydra adds keys given with `+`; the typed config would drop them silently
        raise ConfigError(f"unknown config key {', '.join(unknown)}: not a protorl setting (protorl/config.py)")
    config: Config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), cfg))
    named = [override.split("=", 1)[0].lstrip("+~") for override in overrides]
    return check(config, command, named, resources=resources)


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


# A single run's config as `ValidateBeforeRun.on_run_start` checked it, by (command, run directory): what `run` uses
_checked_before_run: dict[tuple[str, str], tuple[Config, dict | None]] = {}


class ValidateBeforeRun(Callback):
    """Hydra callback: check the config and the run directory before Hydra writes into it, so a typo or a
    mismatched rerun writes nothing (`run` then runs the checked config and claims the directory); in a sweep,
    every job's config before the first starts, so a bad value in one job stops the sweep before any job has run
    (each job checks the memory and time it needs when it starts, on the machine it runs on)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig

        from protorl.storage.rundir import check_run_dir

        jobs = _sweep_jobs(config)
        if jobs is None:  # another sweeper than Hydra's basic one: each job is checked when it starts
            return
        loader, errors = GlobalHydra.instance().config_loader(), []
        try:
            for num, overrides in enumerate(jobs):
                try:  # the memory and time a job needs are checked when it starts, on the machine it runs on
                    job = loader.load_sweep_config(config, overrides)
                    with open_dict(job):
                        job.hydra.job.num, job.hydra.job.id = num, f"{job.hydra.job.name}_{num}"
                    HydraConfig.instance().set_config(job)  # the job's choices name its directory
                    run_dir = str(Path(job.hydra.sweep.dir) / job.hydra.sweep.subdir)
                    keys = [key for key in job if key not in ("hydra", "run_dir")]
                    checked, _ = _checked(OmegaConf.merge(OmegaConf.masked_copy(job, keys), {"run_dir": run_dir}),
                                          job.hydra.job.name, overrides, resources=False)
                    check_run_dir(checked)
                except (HydraException, *_USER_ERRORS) as error:  # Hydra's own: an unknown option, for one
                    errors.append(f"job {num} ({' '.join(overrides)}): {_one_line(error)}")
        except Exception as error:  # Hydra would turn it into a warning and run the sweep unchecked
            _exit_with(f"checking the sweep's jobs failed: {_one_line(error)}", status=1)
        finally:
            HydraConfig.instance().set_config(config)
        if errors:
            shown = errors[:_JOB_ERRORS_SHOWN] + ([f"and {len(errors) - _JOB_ERRORS_SHOWN} more"]
                                                 if len(errors) > _JOB_ERRORS_SHOWN else [])
            _exit_with(f"{len(errors)} of the sweep's {len(jobs)} jobs would stop, nothing has run:\n  "
                       + "\n  ".join(shown))

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from protorl.storage.rundir import check_run_dir

        keys = [key for key in config if key not in ("hydra", "run_dir")]
        user_config = OmegaConf.merge(OmegaConf.masked_copy(config, keys), {"run_dir": config.hydra.run.dir})
        checked, pretrained = checked_config(user_config, config.hydra.job.name, config.hydra.overrides.task)
        try:
            check_run_dir(checked)
        except ConfigError as error:
            _exit_with(_one_line(error))
        except Exception as error:  # Hydra would turn it into a warning and run unchecked
            _exit_with(f"checking the run directory failed: {_one_line(error)}", status=1)
        _checked_before_run[(config.hydra.job.name, str(Path(config.hydra.run.dir).resolve()))] = checked, pretrained


def run(cfg: DictConfig, command: str) -> None:
    """Validate the config, run the phases of `command` in its claimed run directory
    (`protorl.app.commands.run_checked`), then print the summary and, after pre-training with analyses, what
    protorl-analyze prints. User errors exit with status 2, unwritable files too (naming the file); a training that
    diverged exits with status 3."""
    from hydra.core.hydra_config import HydraConfig

    from protorl.app.commands import run_checked
    from protorl.errors import TrainingDiverged
    from protorl.results.analyze import analyze_run
    from protorl.results.report import plot_run, summary
    from protorl.storage.layout import PRETRAIN_DIR

    checked = _checked_before_run.pop((command, str(Path(cfg.run_dir).resolve())), None)  # checked before Hydra wrote
    config, pretrained = checked or checked_config(cfg, command, HydraConfig.get().overrides.task)
    run_dir = Path(config.run_dir).resolve()
    try:
        results = run_checked(config, command, pretrained)
        plot = plot_run(results, run_dir / "curves.png")
        print(summary(results, plot, config.comparison_note), flush=True)
        if (run_dir / PRETRAIN_DIR / "analysis.csv").is_file():  # what protorl-analyze RUN_DIR prints and plots
            print(analyze_run(run_dir), flush=True)
    except TrainingDiverged as error:  # a ProtorlError, with its own exit status
        _exit_with(_one_line(error), status=3)
    except ProtorlError as error:
        _exit_with(_one_line(error))
    except OSError as error:
        _exit_with(f"I/O error on {error.filename or 'a file of the run'}: {error.strerror or error}")
    except KeyboardInterrupt as interrupt:
        _exit_interrupted(interrupt)


INTERRUPTED_STATUS = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


def _exit_interrupted(interrupt: KeyboardInterrupt) -> None:
    """One line saying where Ctrl-C stopped the run and how to resume it; exit status 130."""
    where = str(interrupt) or ("interrupted; rerun the same command to resume: completed phases are kept and a "
                               "phase resumes from its last checkpoint")
    print(f"protorl: {where}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_STATUS)


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"  # Hydra's default sweeper, by name


def _sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """The overrides of each job of a multirun, in the order Hydra's basic sweeper launches them (the experiment's
    `hydra.sweeper.params`, then the command line's; a key given twice takes its last value, in its first place;
    the product of the sweeps, the last varying fastest); None for another sweeper."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    choices: dict[str, list[str]] = {}
    for override in parser.parse_overrides(params + list(config.hydra.overrides.task)):
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise HydraException(f"the basic sweeper does not support sweep type: {override.value_type.name}")
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*choices.values())]


def _exit_with(error: Exception | str, status: int = 2) -> None:
    print(f"protorl: error: {error}", file=sys.stderr, flush=True)
    sys.exit(status)


def _one_line(error: BaseException) -> str:
    """An error (Hydra's and OmegaConf's included) as one line: its message, then its cause's, without the
    config search path and the full-key details."""
    parts = []
    for part in (error, error.__cause__):
        text = str(part or "").split("Config search path")[0].split("full_key:")[0]
        text = " ".join(text.replace("\t", " ").split())
        if text and text not in parts:
            parts.append(text)
    return ": ".join(parts) or type(error).__name__


def _hydra_entry(main, command: str) -> None:
    """Run the Hydra main function of `command`: `--help` prints `command_help`; Hydra's own user errors (an unknown
    key, a value of the wrong type, a missing config group option, an unparsable override) end as one
    `protorl: error:` line, exit status 2."""
    if {"--help", "-h"} & set(sys.argv[1:]):
        print(command_help(command))
        return

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its multi-line report
    try:
        main()
    except KeyboardInterrupt as interrupt:  # before or after the run itself, e.g. while Hydra composes the config
        _exit_interrupted(interrupt)
    except OverrideParseException as error:
        _exit_with(_unparsable(error.override, error.message))
    except MissingConfigException as error:  # e.g. agent=protoo: a config group has no such option
        _exit_with(_missing_option(error))
    except (HydraException, OmegaConfBaseException) as error:
        _exit_with(_one_line(error))


def _missing_option(error: MissingConfigException) -> str:
    """A config group's unknown option (`group=name`) as one line: the options there are, and the closest."""
    group, _, name = (error.missing_cfg_file or "").rpartition("/")
    if not group or not error.options:
        return _one_line(error)
    return (f"{group}={name}: no such {group}{did_you_mean(name, error.options)}; the {group}s are "
            f"{', '.join(error.options)}")


def _unparsable(override: str, message: str) -> str:
    """What to do about an override that Hydra's grammar cannot read: most often a value that needs quotes."""
    key, _, value = override.partition("=")
    quoted = f"\"{key}='{value}'\"" if value else "KEY='VALUE'"
    return (f"cannot read the override {override} ({message.split(':')[0]}): a value holding spaces, letters "
            f"outside ASCII or other special characters must be quoted, e.g. {quoted} in a shell")


def run_job(cfg: DictConfig, command: str) -> None:
    """`run`; in a sweep (-m), a job that stops with an error leaves its phases incomplete and lets the
    other jobs run (the sweep's index lists it and the sweep exits non-zero); Ctrl-C stops the sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        run(cfg, command)
    except SystemExit as stop:
        if stop.code in (0, None, INTERRUPTED_STATUS) or HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        log.error("job %s stopped (exit status %s); the sweep goes on", HydraConfig.get().job.num, stop.code)


@hydra.main(version_base="1.3", config_path="../conf", config_name="pretrain")
def _pretrain(cfg: DictConfig) -> None:
    """Task-agnostic pre-training; writes snapshots for `protorl-finetune`."""
    run_job(cfg, "pretrain")


@hydra.main(version_base="1.3", config_path="../conf", config_name="finetune")
def _finetune(cfg: DictConfig) -> None:
    """Downstream RL on a frozen pre-trained representation (needs snapshot=PATH)."""
    run_job(cfg, "finetune")


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def _train(cfg: DictConfig) -> None:
    """Pre-training then fine-tuning on `env`, as in the paper's protocol."""
    run_job(cfg, "train")


def pretrain() -> None:
    """protorl-pretrain: task-agnostic pre-training; writes snapshots for `protorl-finetune`."""
    _hydra_entry(_pretrain, "pretrain")


def finetune() -> None:
    """protorl-finetune: downstream RL on a frozen pre-trained representation (needs snapshot=PATH)."""
    _hydra_entry(_finetune, "finetune")


def train() -> None:
    """protorl-train: pre-training then fine-tuning on `env`, as in the paper's protocol."""
    _hydra_entry(_train, "train")


# what each Hydra command does and the keys a user sets first (`--help`)
COMMAND_HELP = {
    "train": ("pre-training, then fine-tuning from its last snapshot, in one run directory. With no arguments it "
              "runs the main job (preset=demo): Proto-RL in the paper's U-maze from states, minutes on a 2-core "
              "CPU, its fine-tuning beside the same fine-tuning without pre-training.",
              [("seed=N", "another seed of the same run (default 1)"),
               ("preset=NAME", "the run's scale: demo (the main job), small (cartpole from pixels, minutes on a "
                               "CPU), paper (the paper's settings: days on a CPU, hours on a GPU)"),
               ("env=TASK", "the task, with preset=small or preset=paper (protorl-tasks lists them); the main "
                            "job's preset names its own")]),
    "pretrain": ("task-agnostic pre-training: exploration without reward, writing snapshots for protorl-finetune. "
                 "With no arguments it runs the paper's settings (preset=paper: 500k frames from pixels at batch "
                 "512), which a CPU runs in days: it says so before starting.",
                 [("preset=small", "minutes on a CPU (cartpole from pixels, 4k frames)"),
                  ("env=TASK", "the task whose world it explores (protorl-tasks lists them)"),
                  ("agent=NAME", "the method (the agents are below): proto is Proto-RL, proto_paper Proto-RL as "
                                 "published")]),
    "finetune": ("downstream RL on a task, from a pre-training snapshot whose encoder, projector and prototypes "
                 "stay frozen. It needs snapshot=PATH: with no arguments it names the commands that write one.",
                 [("snapshot=PATH", "the snapshot: <run directory>/pretrain/snapshots/snapshot_<frames>.pt"),
                  ("env=TASK", "the task, of the snapshot's domain (protorl-tasks lists them)"),
                  ("preset=NAME", "the same preset as the pre-training: small, demo or paper (the default)")]),
}
HELP_GROUPS = {  # config group -> what choosing it does; the schema's and the presets' own groups are internal
    "preset": "the run's scale",
    "agent": "the method",
    "experiment": "a paper figure's or a study's sweep (with -m)",
    "multitask": "one pre-training, several downstream tasks",
}


def command_help(command: str) -> str:
    """`protorl-<command> --help`: what it does, the keys a user changes first, the config groups' options and
    where every key is documented."""
    import textwrap
    from importlib.resources import files

    what, keys = COMMAND_HELP[command]
    name = f"protorl-{command}"
    lines = [*textwrap.wrap(f"{name}: {what}", 100), "", f"usage: {name} [KEY=VALUE ...] [GROUP=OPTION ...] "
             "[-m: a sweep over comma-separated values]", "", "the keys to change first:"]
    width = max(len(key) for key, _ in keys)
    for key, meaning in keys:
        lines += textwrap.wrap(meaning, 100, initial_indent=f"  {key:<{width}}  ", subsequent_indent=" " * (width + 4))
    lines += ["", "config groups (GROUP=OPTION):"]
    conf = files("protorl.conf")
    for group, meaning in HELP_GROUPS.items():
        options = sorted({item.name.removesuffix(".yaml") for item in conf.joinpath(group).iterdir()
                          if item.name.endswith(".yaml")} | (set(registered_agents()) if group == "agent" else set()))
        lines += textwrap.wrap(", ".join(options), 100, initial_indent=f"  {group}: {meaning}: ",
                               subsequent_indent="    ")
    docs = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
    lines += ["", *textwrap.wrap(f"every key, its default and its unit: "
                                 f"{docs if docs.is_file() else 'docs/commands.md'} (the documentation site's "
                                 f"\"Commands and configuration\"); the config a command would run, with your "
                                 f"overrides: {name} ... --cfg job; Hydra's own options: {name} --hydra-help", 100)]
    return "\n".join(lines)


class _ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one `protorl: error:` line, exit status 2, like every other user error."""

    def error(self, message: str) -> None:
        _exit_with(f"{self.prog}: {message} (see {self.prog} --help)")


def tasks(argv: list[str] | None = None) -> None:
    """protorl-tasks: every task name `env=` accepts, by domain, each with what earns its reward."""
    from protorl.envs.catalog import catalog
    from protorl.envs.names import GYMNASIUM_PREFIX

    _ArgumentParser(prog="protorl-tasks", description=tasks.__doc__).parse_args(argv)
    lines = []
    for domain, what, named in catalog():
        width = max(len(task) for task, _ in named)
        lines += [f"{domain}: {what}" if what else domain,
                  *(f"  {task:<{width}}  {description}".rstrip() for task, description in named), ""]
    lines.append(f"{GYMNASIUM_PREFIX}<id>: any Gymnasium environment, e.g. {GYMNASIUM_PREFIX}Pendulum-v1 "
                 '(pip install -e ".[gym]")')
    print("\n".join(lines))


def analyze(argv: list[str] | None = None) -> None:
    """protorl-analyze RUN_DIR: coverage and reward-variance plots and a text summary of a run's pre-training."""
    from protorl.errors import ResultsError
    from protorl.results.analyze import analyze_run

    parser = _ArgumentParser(prog="protorl-analyze", description=analyze.__doc__)
    parser.add_argument("run_dir", type=Path, help="a run directory (holding pretrain/analysis.csv)")
    args = parser.parse_args(argv)
    try:
        print(analyze_run(args.run_dir), flush=True)
    except (ResultsError, OSError, OmegaConfBaseException) as error:  # bad files: one line
        _exit_with(_one_line(error))


def probe(argv: list[str] | None = None) -> None:
    """protorl-probe SNAPSHOT [SNAPSHOT ...]: what a frozen encoder knows, as the R^2 of a linear probe from its
    features to the physical state, beside a randomly initialised encoder's and the observation's own; for several
    snapshots (seeds, methods), also their means across runs with 95% CIs."""
    import csv

    from protorl.results.probe import probe_snapshots, summary_table

    parser = _ArgumentParser(prog="protorl-probe", description=probe.__doc__)
    parser.add_argument("snapshots", type=Path, nargs="+", metavar="snapshot",
                        help="pre-training snapshots (snapshot_<frames>.pt)")
    parser.add_argument("--samples", type=int, default=4000, help="frames of the uniform-random policy (agent steps)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the environment and the random policy")
    parser.add_argument("--init-seeds", type=int, nargs="*", default=[1, 2, 3],
                        help="seeds of the randomly initialised encoders shown for reference")
    parser.add_argument("--csv", type=Path, help="also write every snapshot's rows to this CSV file")
    parser.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads; default: torch's); "
                        "1 beside other jobs, as a sweep's runs use")
    args = parser.parse_args(argv)
    if args.samples < 20:
        _exit_with(f"--samples={args.samples}: at least 20 frames (a quarter of them are held out)")
    if args.threads is not None and args.threads < 1:
        _exit_with(f"--threads={args.threads}: at least 1")
    missing = [str(path) for path in args.snapshots if not path.is_file()]
    if missing:
        _exit_with(f"no snapshot file at {', '.join(missing)}")
    if args.csv is not None and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        _exit_with(f"--csv {args.csv}: not a file in an existing directory")
    if len(args.snapshots) > 1:
        from protorl.results.stats import require_rliable

        try:
            require_rliable()
        except ProtorlError as error:
            _exit_with(_one_line(error))
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        results = probe_snapshots(args.snapshots, args.samples, args.seed, args.init_seeds)
    except (ProtorlError, OSError) as error:
        _exit_with(_one_line(error))
    for path, result in zip(args.snapshots, results, strict=True):
        print(f"{path}\n{result.table()}\n" if len(results) > 1 else result.table(), flush=True)
    if len(results) > 1:
        print(summary_table(results), flush=True)
    if args.csv is not None:
        rows = [{"snapshot": str(path), **row} for path, result in zip(args.snapshots, results, strict=True)
                for row in result.csv_rows()]
        columns = list(dict.fromkeys(column for row in rows for column in row))  # tasks differ in their states
        with open(args.csv, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)


def _reference_score(text: str) -> tuple[str, float]:
    """`TASK=SCORE` of `--reference`, SCORE a positive number."""
    task, _, score = text.partition("=")
    try:
        value = float(score)
    except ValueError:
        value = math.nan
    if not task or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not TASK=SCORE with a positive SCORE, e.g. walker_stand=984")
    return task, value


def aggregate(argv: list[str] | None = None) -> None:
    """protorl-aggregate PATH [PATH ...]: learning curves, final-score tables and rliable statistics (IQM,
    mean, median, optimality gap, performance profiles) over the downstream phases of runs and sweeps."""
    from protorl.errors import ResultsError
    from protorl.results.aggregate import aggregate_runs
    from protorl.results.records import RETURN, SCORES, SUCCESS, pretraining_metric

    parser = _ArgumentParser(prog="protorl-aggregate", description=aggregate.__doc__)
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
                             "coverage/entropy (figure 9) or variance/proto_cv (figure 10); success_rate: the "
                             "downstream evaluations' success rate (sparse tasks)")
    parser.add_argument("--score", choices=SCORES, default="final",
                        help="a run's score: its last evaluation (default) or the mean over its evaluations, "
                             "which rewards solving a task sooner")
    parser.add_argument("--tasks", nargs="+", default=None, metavar="TASK",
                        help="only these downstream tasks (default: every task found)")
    parser.add_argument("--reference", nargs="+", default=None, metavar="TASK=SCORE", type=_reference_score,
                        help="divide each task's return by this score instead of the task's maximum return for "
                             "rliable's statistics, one per task, e.g. an expert's score for expert-normalised "
                             "scores as URLB reports them")
    parser.add_argument("--all-curves", action="store_true",
                        help="draw methods without pre-training (DrQ, SAC from scratch) as curves too, instead of "
                             "a line at their final mean (as the paper's figures draw DrQ)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.reference is not None and args.metric is not None:
        parser.error("--reference normalises the downstream return; it does not apply to --metric")
    references = None if args.reference is None else dict(args.reference)
    if references is not None and len(references) < len(args.reference):
        parser.error("--reference names a task twice")
    metric = RETURN if args.metric is None else SUCCESS if args.metric == "success_rate" else \
        pretraining_metric(args.metric)
    metric = dataclasses.replace(metric, over=args.score, references=references)
    try:
        print(aggregate_runs(args.paths, args.out, args.group_by, args.reps, args.seed, metric, args.tasks,
                             args.all_curves),
              flush=True)
    except (ResultsError, OSError, OmegaConfBaseException) as error:  # bad files: one line
        _exit_with(_one_line(error))
