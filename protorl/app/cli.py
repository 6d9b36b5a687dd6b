"""The Hydra commands: protorl-pretrain, protorl-finetune, protorl-train (the others: `protorl.app.tools`).

    protorl-train                                   # the main job (preset=demo): the U-maze from states
    protorl-train preset=paper task=walker_run      # the paper's 500k + 500k frames
    protorl-pretrain task=walker_walk seed=3
    protorl-finetune task=walker_run snapshot=runs/.../pretrain/snapshots/snapshot_500000.pt
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
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
from protorl.app.exits import INTERRUPTED_STATUS, exit_interrupted, exit_with, one_line
from protorl.config import RENAMED, Config, ConfigError, renamed_message, unknown_key_message
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
    is refused, not dropped. `overrides`: the command line's; a `task` named there must be a task of the run.
    """
    try:
        return _checked(cfg, command, overrides)
    except _USER_ERRORS as error:
        exit_with(one_line(error))


def _checked(cfg: DictConfig, command: str, overrides: Sequence[str],
             resources: bool = True) -> tuple[Config, dict | None]:
    from protorl.app.commands import check

    unknown = _unknown_keys(cfg, Config)
    if unknown:  # Hydra adds keys given with `+`; the typed config would drop them silently
        raise ConfigError(unknown_key_message(unknown))
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
                    errors.append(f"job {num} ({' '.join(overrides)}): {_hydra_message(error)}")
        except Exception as error:  # Hydra would turn it into a warning and run the sweep unchecked
            exit_with(f"checking the sweep's jobs failed: {one_line(error)}", status=1)
        finally:
            HydraConfig.instance().set_config(config)
        if errors:
            shown = errors[:_JOB_ERRORS_SHOWN] + ([f"and {len(errors) - _JOB_ERRORS_SHOWN} more"]
                                                 if len(errors) > _JOB_ERRORS_SHOWN else [])
            exit_with(f"{len(errors)} of the sweep's {len(jobs)} jobs would stop, nothing has run:\n  "
                       + "\n  ".join(shown))

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        from protorl.storage.rundir import check_run_dir

        keys = [key for key in config if key not in ("hydra", "run_dir")]
        user_config = OmegaConf.merge(OmegaConf.masked_copy(config, keys), {"run_dir": config.hydra.run.dir})
        checked, pretrained = checked_config(user_config, config.hydra.job.name, config.hydra.overrides.task)
        try:
            check_run_dir(checked)
        except ConfigError as error:
            exit_with(one_line(error))
        except Exception as error:  # Hydra would turn it into a warning and run unchecked
            exit_with(f"checking the run directory failed: {one_line(error)}", status=1)
        _checked_before_run[(config.hydra.job.name, str(Path(config.hydra.run.dir).resolve()))] = checked, pretrained


def run(cfg: DictConfig, command: str) -> None:
    """Validate the config, run the phases of `command` in its claimed run directory
    (`protorl.app.commands.run_checked`), then print the summary and, after pre-training with analyses, what
    protorl-analyze prints. User errors exit with status 2, unwritable files too (naming the file); a training that
    diverged exits with status 3."""
    from hydra.core.hydra_config import HydraConfig

    from protorl.app.commands import run_checked
    from protorl.errors import TrainingDiverged
    from protorl.reports.analyze import analyze_run
    from protorl.reports.report import plot_run, summary
    from protorl.storage.run_files import PRETRAIN_DIR

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
        exit_with(one_line(error), status=3)
    except ProtorlError as error:
        exit_with(one_line(error))
    except OSError as error:
        exit_with(f"I/O error on {error.filename or 'a file of the run'}: {error.strerror or error}")
    except KeyboardInterrupt as interrupt:
        exit_interrupted(interrupt)


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


def _hydra_entry(main, command: str) -> None:
    """Run the Hydra main function of `command`: `--help` prints `command_help`; Hydra's own user errors (an unknown
    key, a value of the wrong type, a missing config group option, an unparsable override) end as one
    `protorl: error:` line, exit status 2."""
    if {"--help", "-h"} & set(sys.argv[1:]):
        print(command_help(command))
        return

    renamed = _renamed_override(sys.argv[1:])
    if renamed is not None:
        exit_with(renamed_message(renamed))
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its multi-line report
    try:
        main()
    except KeyboardInterrupt as interrupt:  # before or after the run itself, e.g. while Hydra composes the config
        exit_interrupted(interrupt)
    except OverrideParseException as error:
        exit_with(_unparsable(error.override, error.message))
    except MissingConfigException as error:  # e.g. agent=protoo: a config group has no such option
        exit_with(_missing_option(error))
    except (HydraException, OmegaConfBaseException) as error:
        exit_with(_hydra_message(error))


def _hydra_message(error: Exception) -> str:
    """One line for an error of Hydra or OmegaConf: the key to write instead where it names a key the grouped
    config renamed (e.g. in an experiment file of one's own)."""
    key = re.search(r"(?:Key|override) '([\w.]+)'", str(error))
    if key and key[1] in RENAMED:
        return renamed_message(key[1])
    if key and str(error).startswith("Could not override"):  # Hydra's hint, `+key=value`, is refused too
        return unknown_key_message([key[1]])
    return one_line(error)


def _renamed_override(arguments: Sequence[str]) -> str | None:
    """The first key of the command line's overrides that the grouped config renamed (`env=TASK` is one; the
    group's `env.obs=...` is not); None if there is none."""
    for argument in arguments:
        key = argument.partition("=")[0].lstrip("+~")
        if "=" in argument and key in RENAMED:
            return key
    return None


def _missing_option(error: MissingConfigException) -> str:
    """A config group's unknown option (`group=name`) as one line: the options there are, and the closest."""
    group, _, name = (error.missing_cfg_file or "").rpartition("/")
    if not group or not error.options:
        return one_line(error)
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
    """Pre-training then fine-tuning on `task`, as in the paper's protocol."""
    run_job(cfg, "train")


def pretrain() -> None:
    """protorl-pretrain: task-agnostic pre-training; writes snapshots for `protorl-finetune`."""
    _hydra_entry(_pretrain, "pretrain")


def finetune() -> None:
    """protorl-finetune: downstream RL on a frozen pre-trained representation (needs snapshot=PATH)."""
    _hydra_entry(_finetune, "finetune")


def train() -> None:
    """protorl-train: pre-training then fine-tuning on `task`, as in the paper's protocol."""
    _hydra_entry(_train, "train")


# what each Hydra command does and the keys a user sets first (`--help`)
COMMAND_HELP = {
    "train": ("pre-training, then fine-tuning from its last snapshot, in one run directory. With no arguments it "
              "runs the main job (preset=demo): Proto-RL in the paper's U-maze from states, minutes on a 2-core "
              "CPU, its fine-tuning beside the same fine-tuning without pre-training.",
              [("seed=N", "another seed of the same run (default 1)"),
               ("preset=NAME", "the run's scale: demo (the main job), small (cartpole from pixels, minutes on a "
                               "CPU), paper (the paper's settings: days on a CPU, hours on a GPU)"),
               ("task=TASK", "the task, with preset=small or preset=paper (protorl-tasks lists them); the main "
                            "job's preset names its own")]),
    "pretrain": ("task-agnostic pre-training: exploration without reward, writing snapshots for protorl-finetune. "
                 "With no arguments it runs the paper's settings (preset=paper: 500k frames from pixels at batch "
                 "512), which a CPU runs in days: it says so before starting.",
                 [("preset=small", "minutes on a CPU (cartpole from pixels, 4k frames)"),
                  ("task=TASK", "the task whose world it explores (protorl-tasks lists them)"),
                  ("agent=NAME", "the method (the agents are below): proto is Proto-RL, proto_paper Proto-RL as "
                                 "published")]),
    "finetune": ("downstream RL on a task, from a pre-training snapshot whose encoder, projector and prototypes "
                 "stay frozen. It needs snapshot=PATH: with no arguments it names the commands that write one.",
                 [("snapshot=PATH", "the snapshot: <run directory>/pretrain/snapshots/snapshot_<frames>.pt"),
                  ("task=TASK", "the task, of the snapshot's domain (protorl-tasks lists them)"),
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


