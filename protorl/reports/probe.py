"""What a frozen encoder knows: a linear probe from its features to the environment's physical state.

    import protorl
    result = protorl.probe_snapshot("runs/maze/pretrain/snapshots/snapshot_100000.pt")
    print(result.table())     # R^2 per state dimension and their mean, for each kind of features

`samples` observations of the snapshot's pre-training task and their physical states
(`protorl.exploration.probe.collect_frames`), a ridge regression from features to states scored on held-out frames
(`protorl.exploration.probe.ridge_r2`): R^2 per state dimension, and their mean. The features: the snapshot's
encoder (and for Proto-RL its projections), the same architecture randomly initialised (one row per init seed), and the
observations themselves (pixels average-pooled to `pool` x `pool` per channel, or the states): the reference
points a reader needs to tell learned features from an architecture's or the input's own.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from protorl.agents.capabilities import Prototypes
from protorl.exploration.probe import ProbeFrames, collect_frames, pooled, ridge_r2
from protorl.pretrained import Pretrained, load_pretrained
from protorl.reports.io import agent_choice
from protorl.storage.run_files import CONFIG_FILE


@torch.no_grad()
def encoded(pretrained: Pretrained, obs: np.ndarray, project: bool = False, chunk: int = 256) -> np.ndarray:
    """The frozen encoder's features (N, R) of observations (N, *obs_shape), or its L2-normalised projections."""
    encode = pretrained.project if project else pretrained.encode
    return torch.cat([encode(obs[i:i + chunk]).float().cpu() for i in range(0, len(obs), chunk)]).numpy()


def randomly_initialised(pretrained: Pretrained, seed: int) -> Pretrained:
    """An untrained `Pretrained` of the same agent and architecture, its networks initialised under `seed`."""
    agent = pretrained.agent
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        twin = type(agent)(agent.obs_type, pretrained.obs_shape, agent.action_shape, agent.cfg, agent.device,
                           "frozen")
    return Pretrained(twin, pretrained.env_spec, pretrained.config, frames=0)


@dataclass
class ProbeResult:
    """R^2 per state dimension for each kind of features (rows), on `samples` frames of `task`, for the snapshot
    of `method` (the agent config it was pre-trained with, e.g. proto_variant) after `pretrain_frames` frames."""

    task: str
    samples: int
    seed: int
    state_names: list[str]
    method: str = ""
    pretrain_frames: int = 0
    rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # features -> R^2 (S,)

    def mean(self, features: str) -> float:
        """The mean R^2 over the state dimensions (those not constant on the scored frames)."""
        return float(np.nanmean(self.rows[features]))

    def table(self) -> str:
        """The rows as a text table: features, mean R^2, R^2 per state dimension."""
        width = max(len(name) for name in self.rows)
        header = f"{'features':<{width}}  {'mean':>6}  " + "  ".join(f"{n:>18}" for n in self.state_names)
        lines = [f"linear state probe on {self.samples} frames of {self.task} (uniform-random policy, seed "
                 f"{self.seed}; R^2 on the held-out quarter)", header]
        for name, r2 in self.rows.items():
            lines.append(f"{name:<{width}}  {self.mean(name):6.3f}  " + "  ".join(f"{v:18.3f}" for v in r2))
        return "\n".join(lines)

    def csv_rows(self) -> list[dict[str, str | float]]:
        """One dict per features: `method`, `pretrain_frames`, `features`, `r2_mean` and `r2/<state dimension>`."""
        return [{"method": self.method, "pretrain_frames": self.pretrain_frames, "features": name,
                 "r2_mean": self.mean(name),
                 **{f"r2/{dim}": float(v) for dim, v in zip(self.state_names, r2, strict=True)}}
                for name, r2 in self.rows.items()]


def probe_snapshot(path: str | Path, samples: int = 4000, seed: int = 0, init_seeds: Sequence[int] = (1, 2, 3),
                   pool: int = 16, test_fraction: float = 0.25, device: str | torch.device = "auto") -> ProbeResult:
    """The linear state probe of a pre-training snapshot (module docstring): its encoder, its projections
    (Proto-RL), randomly initialised encoders of the same architecture (`init_seeds`) and the pooled observations,
    on `samples` frames of its pre-training task collected with `seed`."""
    (result,) = probe_snapshots([path], samples, seed, init_seeds, pool, test_fraction, device)
    return result


def probe_snapshots(paths: Sequence[str | Path], samples: int = 4000, seed: int = 0,
                    init_seeds: Sequence[int] = (1, 2, 3), pool: int = 16, test_fraction: float = 0.25,
                    device: str | torch.device = "auto") -> list[ProbeResult]:
    """`probe_snapshot` of each snapshot, in order; snapshots of the same task and observation settings share
    their frames (collected once). Every snapshot is loaded before the first is probed, so that a bad one is
    reported at once; the rows that do not depend on a snapshot's training (the randomly initialised encoders of the
    same agent and settings, the observations) are probed once per frames. `summary_table` sums the results up
    across runs."""
    snapshots = [(Path(path), load_pretrained(path, device)) for path in paths]
    frames_by_settings: dict[tuple, ProbeFrames] = {}
    shared_rows: dict[tuple, np.ndarray] = {}  # rows that do not depend on a snapshot's training -> R^2 (S,)
    results = []
    for path, pretrained in snapshots:
        config, spec = pretrained.config, pretrained.env_spec
        task = config.get("pretrain_task") or config["task"]
        settings = dict(obs=spec["obs_type"], image_size=config["env"]["image_size"],
                        frame_stack=config["env"]["frame_stack"], action_repeat=spec["action_repeat"],
                        camera_id=config["env"].get("camera_id"))
        key = (task, *settings.values())
        if key not in frames_by_settings:
            frames_by_settings[key] = collect_frames(task, samples, seed, **settings)
        frames = frames_by_settings[key]
        rows = probe_rows(pretrained, frames, key, init_seeds, pool, test_fraction, shared_rows)
        results.append(ProbeResult(task, samples, seed, frames.state_names, snapshot_method(path, config),
                                   pretrained.frames, rows))
    return results


def probe_rows(pretrained: Pretrained, frames: ProbeFrames, frames_key: tuple, init_seeds: Sequence[int], pool: int,
               test_fraction: float, shared_rows: dict[tuple, np.ndarray]) -> dict[str, np.ndarray]:
    """Each kind of features of `probe_snapshot` -> its R^2 per state dimension (S,) on `frames`. The rows that do
    not depend on the snapshot's training (the randomly initialised encoders, the observations) are read from and
    added to `shared_rows`, keyed by `frames_key` (the frames' task and settings) and what else they depend on."""

    def probe(features: np.ndarray) -> np.ndarray:
        return ridge_r2(features, frames.states, test_fraction)

    agent = pretrained.agent
    rows = {f"encoder ({pretrained.frames} frames)": probe(encoded(pretrained, frames.obs))}
    if isinstance(agent, Prototypes):
        rows[f"projection ({pretrained.frames} frames)"] = probe(encoded(pretrained, frames.obs, project=True))
    for init_seed in init_seeds:
        key = (frames_key, type(agent), repr(agent.cfg), tuple(pretrained.obs_shape), tuple(agent.action_shape),
               str(agent.device), init_seed)
        if key not in shared_rows:
            shared_rows[key] = probe(encoded(randomly_initialised(pretrained, init_seed), frames.obs))
        rows[f"random encoder (init seed {init_seed})"] = shared_rows[key]
    key = (frames_key, "observation", pool)
    if key not in shared_rows:
        shared_rows[key] = probe(pooled(frames.obs, pool))
    rows["observation" + (f" (pooled {pool}x{pool})" if frames.obs.ndim > 2 else "")] = shared_rows[key]
    return rows


def snapshot_method(path: Path, config: dict) -> str:
    """The agent config a snapshot's run was started with (`proto`, `proto_variant`, ...) when the snapshot lies in
    its run directory (`<run>/pretrain/snapshots/`), else its agent's name."""
    run_dir = path.resolve().parent.parent.parent
    if path.resolve().parent.name == "snapshots" and (run_dir / CONFIG_FILE).is_file():
        return agent_choice(run_dir, OmegaConf.create(config))
    return str(config["agent"]["name"])


def summary_groups(results: Sequence[ProbeResult]) -> dict[str, np.ndarray]:
    """Each kind of features across the snapshots -> its mean R^2 per run (runs,), in this order: each method's
    encoder and projections after F frames (a run per snapshot); the randomly initialised encoders (a run per
    init seed, counted once however many snapshots share it; one group per method, methods whose random encoders
    score exactly alike sharing one); the observations (one run per task's frames). With snapshots of several
    tasks, each group is of one task, named in its key."""
    several_tasks = len({result.task for result in results}) > 1
    learned: dict[str, list[float]] = {}
    initialised: dict[tuple[str, str], dict[str, float]] = {}  # (task, method) -> init seed's row -> mean R^2
    observed: dict[str, float] = {}
    for result in results:
        on_task = f" on {result.task}" if several_tasks else ""
        for name in result.rows:
            if name.startswith("random encoder"):
                initialised.setdefault((result.task, result.method), {})[name] = result.mean(name)
            elif name.startswith("observation"):
                observed[f"{name}{on_task}"] = result.mean(name)
            else:
                learned.setdefault(f"{result.method}: {name}{on_task}", []).append(result.mean(name))
    alike: dict[tuple, list[str]] = {}  # (task, the init seeds' values) -> the methods whose random encoders have them
    for (task, method), runs in initialised.items():
        alike.setdefault((task, tuple(sorted(runs.items()))), []).append(method)
    groups = {key: np.array(values) for key, values in learned.items()}
    for (task, runs), methods in alike.items():
        on_task = f" on {task}" if several_tasks else ""
        groups[f"randomly initialised encoder ({', '.join(methods)}){on_task}"] = np.array([v for _, v in runs])
    groups.update({key: np.array([value]) for key, value in observed.items()})
    return groups


def summary_table(results: Sequence[ProbeResult], reps: int = 2000) -> str:
    """Per kind of features across the snapshots (`summary_groups`): the mean R^2 over runs, rliable's 95%
    bootstrap CI of it, and each run's value."""
    from protorl.reports.stats import require_rliable

    require_rliable()
    from rliable import library, metrics

    groups = summary_groups(results)
    points, intervals = library.get_interval_estimates(
        {key: values[:, None] for key, values in groups.items()},
        lambda scores: np.array([metrics.aggregate_mean(scores)]), reps=reps)  # runs x 1 "task": a bootstrap
    width = max(len(key) for key in groups)
    lines = [f"mean R^2 across runs (95% bootstrap CI over runs, {reps} resamples)",
             f"{'features':<{width}}  {'runs':>4}  {'mean':>6}  {'95% CI':>16}  per run"]
    for key, values in groups.items():
        (mean,), (low, high) = points[key], intervals[key][:, 0]
        lines.append(f"{key:<{width}}  {len(values):>4}  {mean:6.3f}  [{low:6.3f}, {high:6.3f}]  "
                     + " ".join(f"{v:.3f}" for v in values))
    return "\n".join(lines)


def write_csv(path: Path, snapshots: Sequence[Path], results: Sequence[ProbeResult]) -> None:
    """Every snapshot's rows (`ProbeResult.csv_rows`) in one CSV file, each with its snapshot's path."""
    rows = [{"snapshot": str(snapshot), **row} for snapshot, result in zip(snapshots, results, strict=True)
            for row in result.csv_rows()]
    columns = list(dict.fromkeys(column for row in rows for column in row))  # tasks differ in their states
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
