"""Fingerprint tiny same-seed runs of every agent: what "behaviour unchanged" is checked against.

Runs `protorl-train` for each agent at a tiny size (pre-training and fine-tuning; DrQ online; the main job's
preset unless `--overrides` names another) and prints, as JSON, a SHA-256 of every CSV row (its values but the
timings and the empty ones) and of every tensor in the snapshots and checkpoints the runs wrote. Two commits give
the same JSON when their runs are the same bit for bit:

    python tools/run_fingerprint.py > before.json      # on the old commit
    python tools/run_fingerprint.py > after.json       # on the new one
    diff before.json after.json

The code's package is the one Python imports: set PYTHONPATH to a checkout of another commit to run that one.
A change that only adds columns or saved tensors compares with them left out, on both sides:

    python tools/run_fingerprint.py --ignore success_rate agent.critic > before.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TINY = ["env.image_size=32", "env.action_repeat=8", "training.seed_transitions=20", "replay.capacity=500",
        "agent.batch_size=8", "agent.hidden_dim=32", "agent.feature_dim=16", "evaluation.episodes=1",
        "evaluation.every_frames=1000", "logging.tensorboard=false", "logging.progress_bar=false",
        "runtime.threads=1", "checkpoints.keep_completed=true", "checkpoints.every_frames=1000", "seed=3"]
PROTO_SIZES = ["agent.num_prototypes=16", "agent.candidates_per_prototype=2", "agent.proj_dim=16",
               "agent.pred_hidden_dim=32"]
RUNS = {  # name -> overrides of protorl-train
    "proto_variant": ["agent=proto_variant", *PROTO_SIZES, "pretrain_frames=2000", "finetune_frames=2000",
                      "analyses.every_frames=1000", "task=point_mass_maze_explore",
                      "finetune_tasks=[point_mass_maze_reach_top_left]"],
    "proto": ["agent=proto", *PROTO_SIZES, "pretrain_frames=2000", "finetune_frames=2000",
              "analyses.every_frames=null"],
    "random": ["agent=random", "pretrain_frames=2000", "finetune_frames=2000", "analyses.every_frames=null"],
    "icm": ["agent=icm", "pretrain_frames=2000", "finetune_frames=2000", "analyses.every_frames=null"],
    "apt": ["agent=apt", "agent.knn_k=3", "pretrain_frames=2000", "finetune_frames=2000",
            "analyses.every_frames=1000"],
    "drq": ["agent=drq", "pretrain_frames=0", "finetune_frames=2000", "analyses.every_frames=null"],
}
TIMING_COLUMNS = {"fps", "total_time_s", "analysis/time_s"}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


IGNORED: set[str] = set()  # --ignore: CSV columns, and dotted tensor keys (with what lies under them), left out


def ignored(key: str) -> bool:
    return any(key == name or key.startswith(f"{name}.") for name in IGNORED)


def csv_digest(path: Path) -> str:
    with path.open(newline="") as file:
        rows = [{k: v for k, v in row.items() if k not in TIMING_COLUMNS and v != "" and not ignored(k)}
                for row in csv.DictReader(file)]
    return digest(json.dumps(rows, sort_keys=True).encode())


def tensors(value, prefix: str = ""):
    """(dotted key, tensor) for every tensor nested in dicts and lists."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from tensors(value[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors(item, f"{prefix}.{i}")


def torch_digest(path: Path) -> dict[str, str]:
    payload = torch.load(path, map_location="cpu", weights_only=True)
    return {key: digest(t.contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
            for key, t in tensors(payload) if not ignored(key)}


def fingerprint(run_dir: Path) -> dict:
    result = {}
    for path in sorted(run_dir.rglob("*")):
        rel = str(path.relative_to(run_dir))
        if path.suffix == ".csv":
            result[rel] = csv_digest(path)
        elif path.suffix == ".pt":
            result[rel] = torch_digest(path)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="Hydra overrides added to every run (e.g. preset=small env.obs=pixels)")
    parser.add_argument("--ignore", nargs="+", default=[], metavar="NAME",
                        help="CSV columns and dotted tensor keys (e.g. agent.critic) to leave out")
    args = parser.parse_args()
    IGNORED.update(args.ignore)
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            run_dir = Path(tmp) / name
            command = [sys.executable, "-c", "from protorl.app.cli import train; train()", *TINY, *RUNS[name],
                       *args.overrides, f"hydra.run.dir={run_dir}"]
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp)
            if done.returncode != 0:
                sys.exit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
            out[name] = fingerprint(run_dir)
            print(f"{name}: {len(out[name])} files", file=sys.stderr)
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
