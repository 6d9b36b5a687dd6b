"""The Hydra commands: protorl-pretrain, protorl-finetune, protorl-train (the others: `protorl.app.tools`).

    protorl-train                                   # the main job (preset=demo): the U-maze from states
    protorl-train preset=paper task=walker_run      # the paper's 500k + 500k frames
    protorl-pretrain task=walker_walk seed=3
    protorl-finetune task=walker_run snapshot=runs/.../pretrain/snapshots/snapshot_500000.pt
"""

from __future__ import annotations

import itertools
import logging
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from protorl.agents import BUILT_IN, registered_agents
from protorl.app.exits import exit_for, exit_status, exit_with, one_line, print_error
from protorl.app.plan import RunPlan, config_error, configured, named_keys, plan_run
from protorl.config import Config, ConfigError

log = logging.getLogger("protorl")
_JOB_ERRORS_SHOWN = 5  # a sweep's refused jobs listed one per line, up to this many


def register_configs() -> None:
    """Give Hydra the schema the commands' configs build on (`protorl_schema`) and each agent's config class (its
    YAML in conf/agent/ builds on it; an agent from another package has its class's defaults as its YAML); and
    `${protorl_options:GROUP}`, a config group's options, for `--help` (base.yaml's `hydra.help`)."""
    if not OmegaConf.has_resolver("protorl_options"):
        OmegaConf.register_new_resolver("protorl_options", _group_options)
    store = ConfigStore.instance()
    store.store(name="protorl_schema", node=Config)
    for name, agent in registered_agents().items():
        store.store(group="agent_schema", name=name, node=agent.config_class)
        if name not in BUILT_IN:
            store.store(group="agent", name=name, node=agent.config_class)


def _group_options(group: str) -> str:
    """The options of a config group of protorl's (agents from other packages included), comma-separated, in lines
    of a `--help` indented by 4."""
    options = GlobalHydra.instance().config_loader().get_group_options(group)  # its YAML files and ConfigStore's
    return "\n    ".join(textwrap.wrap(", ".join(options), 90))


def plan_command(settings: DictConfig, command: str, overrides: Sequence[str],
                 on_this_machine: bool = True) -> RunPlan:
    """The plan of `command` with the settings Hydra composed (without Hydra's node, `run_dir` set), typed as the
    Python API's are (`configured`: a key the schema lacks, e.g. added with `+`, is refused); `overrides`: the
    command line's (a `task` named there must be a task of the run; `run_dir` is Hydra's to set)."""
    try:
        fields = OmegaConf.to_container(settings, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(config_error(error)) from None
    named = named_keys(overrides)
    if "run_dir" in named:  # Hydra's output directory would replace it
        raise ConfigError("run_dir is Hydra's output directory on the command line: give hydra.run.dir=PATH "
                          "(a sweep: hydra.sweep.dir=PATH)")
    return plan_run(configured(None, fields), command, named, on_this_machine)


def _settings(config: DictConfig, run_dir: str) -> DictConfig:
    """The run's settings of a config Hydra composed: without Hydra's node, in `run_dir`."""
    keys = [key for key in config if key not in ("hydra", "run_dir")]
    return OmegaConf.merge(OmegaConf.masked_copy(config, keys), {"run_dir": run_dir})


class PlanBeforeRun(Callback):
    """Hydra callback: plan the run before Hydra writes into its directory, so a typo or a mismatched rerun writes
    nothing, and hand the plan to the command (`Command`); in a sweep, plan every job before the first starts, so a
    bad value in one job stops the sweep before any job has run (each job checks the memory and time it needs when
    it starts, on the machine it runs on)."""

    def __init__(self, command: str) -> None:
        self.command = command  # one of `COMMANDS`: its entry config (train.yaml, ...) names it
        self.plan: RunPlan | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        jobs = _sweep_jobs(config)
        if jobs is None:  # a sweeper that does not say how it splits its jobs: each is checked when it starts
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
                    plan_command(_settings(job, run_dir), self.command, overrides, on_this_machine=False)
                except Exception as error:
                    ending = exit_status(error)
                    if ending is None:
                        raise
                    errors.append(f"job {num} ({' '.join(overrides)}): {ending[1]}")
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
        try:  # Hydra would turn an error here into a warning and run unchecked: it ends the command here
            self.plan = plan_command(_settings(config, config.hydra.run.dir), self.command,
                                     config.hydra.overrides.task)
        except Exception as error:
            if exit_status(error) is None:  # a bug: one line, status 1, rather than Hydra's warning
                exit_with(f"planning the run failed: {one_line(error)}", status=1)
            exit_for(error)

    def on_job_start(self, config: DictConfig, task_function, **kwargs) -> None:
        if self.plan is not None and hasattr(task_function, "plan"):  # a `Command`: it runs the plan made here
            task_function.plan, self.plan = self.plan, None


class Command:
    """What Hydra runs for one of the commands: the plan `PlanBeforeRun` made before Hydra wrote the run directory
    (in a sweep's job, one it makes itself), then the summary and, after pre-training with analyses, what
    protorl-analyze prints. An error ends the command (`protorl.app.exits`); in a sweep, a job that stops with an
    error leaves its phases incomplete and lets the other jobs run (the sweep's index lists it and the sweep exits
    non-zero); Ctrl-C stops the sweep."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.plan: RunPlan | None = None  # handed over by `PlanBeforeRun`

    def __call__(self, settings: DictConfig) -> None:
        from protorl.app.commands import run_plan
        from protorl.reports.analyze import analyze_run
        from protorl.reports.report import plot_run, summary
        from protorl.storage.run_files import PRETRAIN_DIR

        plan, self.plan = self.plan, None
        try:
            plan = plan or plan_command(settings, self.name, HydraConfig.get().overrides.task)
            run_dir = Path(plan.config.run_dir).resolve()
            results = run_plan(plan)
            plot = plot_run(results, run_dir / "curves.png")
            print(summary(results, plot, plan.config.comparison_note), flush=True)
            if (run_dir / PRETRAIN_DIR / "analysis.csv").is_file():  # what protorl-analyze RUN_DIR prints and plots
                print(analyze_run(run_dir), flush=True)
        except Exception as error:
            ending = exit_status(error)
            if ending is None or HydraConfig.get().mode != RunMode.MULTIRUN:
                exit_for(error)
            print_error(ending[1])
            log.error("job %s stopped (exit status %s); the sweep goes on", HydraConfig.get().job.num, ending[0])
        except KeyboardInterrupt as interrupt:
            exit_for(interrupt)


def _sweep_jobs(config: DictConfig) -> list[list[str]] | None:
    """The overrides of each job of a multirun under Hydra's basic sweeper (the default), in the order it launches
    them: every combination of the values of its overrides (the experiment's `hydra.sweeper.params`, then the
    command line's; a key given twice keeps its place and takes the last value). None under another sweeper (an
    optimiser's, say) or for a sweep over an interval, which the basic sweeper refuses itself: each job is then
    checked when it starts."""
    if config.hydra.runtime.choices.get("hydra/sweeper") != "basic":
        return None
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    values: dict[str, list[str]] = {}
    for override in parser.parse_overrides(params + list(config.hydra.overrides.task)):
        key = override.get_key_element()
        if not override.is_sweep_override():
            values[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            values[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            return None
    return [list(job) for job in itertools.product(*values.values())]


def _hydra_entry(command: str) -> None:
    """Run `command` under Hydra (`--help`: its YAML's `hydra.help`); every error ends as `protorl.app.exits` says
    (Hydra's own about the command line, e.g. an unknown key or option, as one `protorl: error:` line, status 2)."""
    for library in ("absl", "OpenGL"):  # what MuJoCo's and PyOpenGL's imports log at INFO is not the run's news
        logging.getLogger(library).setLevel(logging.WARNING)
    register_configs()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its multi-line report
    main = hydra.main(version_base="1.3", config_path="../conf", config_name=command)(Command(command))
    try:
        main()
    except (Exception, KeyboardInterrupt) as error:  # before or after the run itself, e.g. while Hydra composes
        exit_for(error)


def pretrain() -> None:
    """protorl-pretrain: task-agnostic pre-training; writes snapshots for `protorl-finetune`."""
    _hydra_entry("pretrain")


def finetune() -> None:
    """protorl-finetune: downstream RL on a frozen pre-trained representation (needs snapshot=PATH)."""
    _hydra_entry("finetune")


def train() -> None:
    """protorl-train: pre-training then fine-tuning on `task`, as in the paper's protocol."""
    _hydra_entry("train")
