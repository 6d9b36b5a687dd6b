"""The commands that read what runs wrote, or list what they can run: protorl-tasks, protorl-analyze, protorl-probe,
protorl-aggregate (argparse)."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from protorl.app.exits import exit_for, exit_with, one_line
from protorl.config import PROBE_MIN_SAMPLES, PROBE_SAMPLES_RULE
from protorl.errors import ResultsError


class _ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one `protorl: error:` line, exit status 2, like every other user error."""

    def error(self, message: str) -> None:
        exit_with(f"{self.prog}: {message} (see {self.prog} --help)")


def tasks(argv: list[str] | None = None) -> None:
    """protorl-tasks: every task name `task=` accepts, by domain, each with what earns its reward."""
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
    from protorl.reports.analyze import analyze_run

    parser = _ArgumentParser(prog="protorl-analyze", description=analyze.__doc__)
    parser.add_argument("run_dir", type=Path, help="a run directory (holding pretrain/analysis.csv)")
    args = parser.parse_args(argv)
    try:
        print(analyze_run(args.run_dir), flush=True)
    except Exception as error:  # bad files: one line (`protorl.app.exits`); a bug keeps its traceback
        exit_for(error)


def probe(argv: list[str] | None = None) -> None:
    """protorl-probe SNAPSHOT [SNAPSHOT ...]: what a frozen encoder knows, as the R^2 of a linear probe from its
    features to the physical state, beside a randomly initialised encoder's and the observation's own; for several
    snapshots (seeds, methods), also their means across runs with 95% CIs."""
    import torch

    from protorl.reports.probe import probe_snapshots, summary_table, write_csv

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
    if args.samples < PROBE_MIN_SAMPLES:
        exit_with(f"--samples={args.samples}: {PROBE_SAMPLES_RULE}")
    if args.threads is not None and args.threads < 1:
        exit_with(f"--threads={args.threads}: at least 1")
    missing = [str(path) for path in args.snapshots if not path.is_file()]
    if missing:
        exit_with(f"no snapshot file at {', '.join(missing)}")
    if args.csv is not None and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        exit_with(f"--csv {args.csv}: not a file in an existing directory")
    try:
        if len(args.snapshots) > 1:  # the statistics across runs need rliable: refused before any probing
            from protorl.reports.stats import require_rliable

            require_rliable()
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        results = probe_snapshots(args.snapshots, args.samples, args.seed, args.init_seeds)
        for path, result in zip(args.snapshots, results, strict=True):
            print(f"{path}\n{result.table()}\n" if len(results) > 1 else result.table(), flush=True)
        if len(results) > 1:
            print(summary_table(results), flush=True)
        if args.csv is not None:
            write_csv(args.csv, args.snapshots, results)
    except (MemoryError, torch.OutOfMemoryError) as error:  # the machine's or a GPU's
        exit_with(f"out of memory probing ({one_line(error).split('. ')[0]}): fewer --samples")
    except Exception as error:  # a bad snapshot: one line (`protorl.app.exits`); a bug keeps its traceback
        exit_for(error)


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
    from protorl.reports.aggregate import aggregate_runs
    from protorl.reports.records import RETURN, SCORES, SUCCESS, pretraining_metric
    from protorl.reports.versus import baseline_method

    parser = _ArgumentParser(prog="protorl-aggregate", description=aggregate.__doc__)
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="run directories (holding config.yaml) or sweep directories holding them")
    parser.add_argument("--out", type=Path, default=Path("aggregate"), help="output directory (default: aggregate)")
    parser.add_argument("--group-by", nargs="+", default=["agent.name"], metavar="KEY",
                        help="dotted config keys whose values label a method (default: agent.name); "
                             "'agent': the agent config chosen, e.g. proto vs proto_variant")
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
    parser.add_argument("--at", type=int, default=None, metavar="FRAMES",
                        help="read each run as it stood at FRAMES frames: once it has passed them (finished or "
                             "not), its score is its last value at or before them; e.g. the coverage of a "
                             "pre-training budget")
    parser.add_argument("--versus", default=None, metavar="KEY",
                        help="a numeric config key to plot the statistics against, e.g. pretrain_frames (the "
                             "pre-training budget): versus.csv and versus.png, methods without pre-training as a "
                             "line across")
    parser.add_argument("--baseline", nargs=2, action="append", default=[], metavar=("CSV", "METHOD"),
                        help="with --versus: METHOD's rows of an aggregate.csv written before, drawn as a line "
                             "across, e.g. --baseline <earlier aggregate>/aggregate.csv drq; METHOD@VALUE draws "
                             "them as a point at that value of KEY, where they were measured, e.g. proto@100000")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.at is not None and args.at < 0:
        parser.error("--at must be a number of frames, 0 or more")
    if args.versus is not None and args.versus in args.group_by:
        parser.error(f"--versus {args.versus} is the figure's x axis: leave it out of --group-by")
    if args.baseline and args.versus is None:
        parser.error("--baseline draws a line across the --versus figure: give --versus KEY")
    try:
        baselines = [(Path(csv), *baseline_method(method)) for csv, method in args.baseline]
    except ResultsError as error:
        parser.error(str(error))
    if args.reference is not None and args.metric is not None:
        parser.error("--reference normalises the downstream return; it does not apply to --metric")
    references = None if args.reference is None else dict(args.reference)
    if references is not None and len(references) < len(args.reference):
        parser.error("--reference names a task twice")
    metric = RETURN if args.metric is None else SUCCESS if args.metric == "success_rate" else \
        pretraining_metric(args.metric)
    metric = dataclasses.replace(metric, over=args.score, references=references, at=args.at)
    try:
        print(aggregate_runs(args.paths, args.out, args.group_by, args.reps, args.seed, metric, args.tasks,
                             args.all_curves, args.versus, baselines),
              flush=True)
    except Exception as error:  # bad files: one line (`protorl.app.exits`); a bug keeps its traceback
        exit_for(error)
