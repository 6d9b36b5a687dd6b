"""Wall time and result of every `*_small` experiment preset, run as docs/reproducing.md says, on this machine.

Each preset runs as a Hydra sweep through the joblib launcher (2 jobs at a time, one torch thread each), then
`protorl-aggregate` summarises it with the figure's own grouping or metric. The two-stage presets (shared
pre-training) run their pre-training sweep, then their fine-tuning sweep on it; their time is the sum.
Prints one line per preset as it ends and a Markdown table at the end; writes `summary.json` and each
preset's `scores.md` under --out.

    python benchmarks/small_presets.py                        # every preset (57 min measured on 2 CPU cores)
    python benchmarks/small_presets.py fig4_small fig14_small # some of them
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHER = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "runtime.threads=1", "logging.progress_bar=false"]


@dataclass
class Stage:
    command: str  # protorl-train, protorl-pretrain or protorl-finetune
    experiment: str
    needs_pretrain_sweep: bool = False  # fine-tunes from the previous stage's sweep (pretrain_sweep=DIR)


@dataclass
class Preset:
    name: str
    stages: list[Stage]
    aggregate: list[list[str]] = field(default_factory=lambda: [[]])  # extra arguments of each aggregation


PRESETS = [
    Preset("fig1_small", [Stage("protorl-train", "fig1_small")]),
    Preset("fig4_small", [Stage("protorl-train", "fig4_small")]),
    Preset("appendix_g_small", [Stage("protorl-train", "appendix_g_small")]),
    Preset("fig5_small", [Stage("protorl-train", "fig5_small")]),
    Preset("fig6_small", [Stage("protorl-train", "fig6_small")], [["--group-by", "agent.name", "pretrain_frames"]]),
    Preset("fig6_shared_small", [Stage("protorl-pretrain", "fig6_pretrain_small"),
                                 Stage("protorl-finetune", "fig6_finetune_small", needs_pretrain_sweep=True)],
           [["--group-by", "agent.name", "pretrain_frames"]]),
    Preset("fig7_small", [Stage("protorl-train", "fig7_small")], [["--group-by", "agent.name", "agent.intr_coef"]]),
    Preset("fig7_shared_small", [Stage("protorl-pretrain", "fig7_pretrain_small"),
                                 Stage("protorl-finetune", "fig7_finetune_small", needs_pretrain_sweep=True)],
           [["--group-by", "agent.name", "agent.intr_coef"]]),
    Preset("fig9_small", [Stage("protorl-pretrain", "fig9_small")], [["--metric", "coverage/entropy"]]),
    Preset("fig10_small", [Stage("protorl-pretrain", "fig10_small")],
           [["--metric", "variance/proto_cv"], ["--metric", "variance/uniform_cv"]]),
    Preset("fig14_small", [Stage("protorl-train", "fig14_small")], [["--group-by", "agent.name", "pretrain_frames"]]),
]


def run_preset(preset: Preset, out: Path) -> dict:
    """Run every stage of `preset` under `out/<name>/`, time it and aggregate the last stage's sweep."""
    root = out / preset.name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    seconds, sweep_dirs, ok = 0.0, [], True
    for stage in preset.stages:
        sweep_dir = root / stage.experiment
        args = [stage.command, "-m", f"experiment={stage.experiment}", *LAUNCHER, f"hydra.sweep.dir={sweep_dir}"]
        if stage.needs_pretrain_sweep:
            args.append(f"pretrain_sweep={sweep_dirs[-1]}")
        start = time.perf_counter()
        with open(root / f"{stage.experiment}.log", "w") as log:
            ok &= subprocess.run(args, stdout=log, stderr=subprocess.STDOUT).returncode == 0
        seconds += time.perf_counter() - start
        sweep_dirs.append(sweep_dir)
    jobs = sum(1 for _ in sweep_dirs[-1].glob("*/config.yaml"))
    tables = []
    for i, extra in enumerate(preset.aggregate):
        agg_dir = root / f"aggregate{i}"
        result = subprocess.run(["protorl-aggregate", str(sweep_dirs[-1]), "--out", str(agg_dir), *extra],
                                capture_output=True, text=True)
        scores = agg_dir / "scores.md"
        tables.append(scores.read_text() if result.returncode == 0 and scores.exists()
                      else f"aggregation failed: {result.stderr.strip().splitlines()[-1:]}")
    return {"preset": preset.name, "commands": [s.command for s in preset.stages], "exit_ok": ok,
            "wall_time_s": round(seconds, 1), "runs_in_last_stage": jobs, "scores": tables}


def main() -> None:
    names = [p.name for p in PRESETS]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("presets", nargs="*", metavar="PRESET",
                        help=f"presets to run (default: all): {', '.join(names)}")
    parser.add_argument("--out", type=Path, default=Path("multirun/small_presets"))
    args = parser.parse_args()
    unknown = sorted(set(args.presets) - set(names))
    if unknown:
        parser.error(f"unknown preset(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    chosen = [p for p in PRESETS if not args.presets or p.name in args.presets]
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = args.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for preset in chosen:
        row = run_preset(preset, args.out)
        summary[preset.name] = row
        summary_path.write_text(json.dumps(summary, indent=1))
        print(f"{preset.name}: {row['wall_time_s'] / 60:.1f} min, {row['runs_in_last_stage']} runs, "
              f"{'ok' if row['exit_ok'] else 'FAILED'}", flush=True)
    print("\n| preset | runs | wall time | exit |\n|---|---|---|---|")
    for row in summary.values():
        print(f"| `{row['preset']}` | {row['runs_in_last_stage']} | {row['wall_time_s'] / 60:.1f} min | "
              f"{'0' if row['exit_ok'] else 'failed'} |")
    for row in summary.values():
        print(f"\n### {row['preset']}\n")
        print("\n\n".join(row["scores"]))
    sys.exit(0 if all(row["exit_ok"] for row in summary.values()) else 1)


if __name__ == "__main__":
    main()
