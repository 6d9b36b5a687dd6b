"""What a frozen encoder knows: a linear probe from its features to the environment's physical state.

    import protorl
    result = protorl.probe_snapshot("runs/maze/pretrain/snapshots/snapshot_100000.pt")
    print(result.table())     # R^2 per state dimension and their mean, for each kind of features

A uniform-random policy with a fixed seed collects `samples` observations of the snapshot's pre-training task, in
short episodes (many starting points), with their physical states (MuJoCo's qpos and qvel: for the U-maze the
point's x, y and velocity). A ridge regression from features (centred, one scale for all) to states is fit on the
first `1 - test_fraction` of them (each state dimension's strength chosen by 5-fold cross-validation on those)
and scored on the rest: R^2 per state dimension, and their mean. The features: the snapshot's encoder (and for
Proto-RL its projections), the same architecture randomly initialised (one row per init seed), and the
observations themselves (pixels average-pooled to `pool` x `pool` per channel, or the states): the reference
points a reader needs to tell learned features from an architecture's or the input's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from protorl.agents.capabilities import Prototypes
from protorl.envs import DMCEnv
from protorl.pretrained import Pretrained, load_pretrained
from protorl.storage.layout import CONFIG_FILE
from protorl.sweep import agent_choice

RIDGE_STRENGTHS = tuple(10.0**k for k in range(-4, 6))  # times N, on features of unit mean square
CV_FOLDS = 5  # contiguous blocks of the fitted frames, each held out in turn to choose the ridge strengths
EPISODE_AGENT_STEPS = 10  # agent steps per episode of the random policy that collects the frames: a random policy
# barely moves a body in a few dozen steps, so the frames of an episode are nearly one sample of the start state


@dataclass
class ProbeFrames:
    """Observations (N, *obs_shape) and their physical states (N, S), in the order the policy met them."""

    obs: np.ndarray
    states: np.ndarray
    state_names: list[str]  # S names, e.g. "position root_x", "velocity root_y"


def collect_frames(task: str, samples: int, seed: int, obs: str = "states", image_size: int = 84,
                   frame_stack: int = 3, action_repeat: int = 2, camera_id: int | None = None,
                   episode_steps: int = EPISODE_AGENT_STEPS) -> ProbeFrames:
    """`samples` observations of a uniform-random policy on `task`, in episodes of at most `episode_steps` agent
    steps (many starts, so that the first frames and the held-out last ones come from the same distribution), the
    environment and the actions seeded by `seed`: the same frames on every call with the same arguments."""
    env = DMCEnv(task, obs=obs, image_size=image_size, frame_stack=frame_stack, action_repeat=action_repeat,
                 camera_id=camera_id, seed=seed)
    rng = np.random.default_rng(seed)
    observations, states = [], []
    time_step, steps = env.reset(), 0
    while len(observations) < samples:
        observations.append(time_step.obs)
        states.append(time_step.physical_state)
        if time_step.last or steps == episode_steps:
            time_step, steps = env.reset(), 0
        else:
            time_step, steps = env.step(rng.uniform(-1.0, 1.0, env.action_shape)), steps + 1
    names = state_names(env)
    env.close()
    return ProbeFrames(np.stack(observations), np.stack(states)[:, :len(names)], names)


def state_names(env: DMCEnv) -> list[str]:
    """The names of the physical state's position and velocity entries (qpos, then qvel)."""
    data = env.physics.named.data
    return ([f"position {name}" for name in data.qpos.axes.row.names] +
            [f"velocity {name}" for name in data.qvel.axes.row.names])


def ridge_r2(features: np.ndarray, targets: np.ndarray, test_fraction: float = 0.25) -> np.ndarray:
    """R^2 per target dimension (S,) of a ridge regression from features (N, F) to targets (N, S), fit on the first
    `1 - test_fraction` of the rows and scored on the rest; nan for a dimension constant on the scored rows. Each
    dimension's strength is the one with the least error over `CV_FOLDS` contiguous blocks of the fitted rows, each
    held out in turn."""
    gram = gram_matrix(features)  # (N, N): every fit below reads the features through it
    y = torch.as_tensor(targets, dtype=torch.float64)
    num_features = int(np.prod(features.shape[1:]))
    fit, test = torch.arange(len(y)).tensor_split([int(len(y) * (1 - test_fraction))])
    validation = torch.zeros(len(RIDGE_STRENGTHS), y.shape[1], dtype=torch.float64)  # (K, S)
    for block in fit.chunk(CV_FOLDS):
        kept = fit[~torch.isin(fit, block)]
        validation += _squared_errors(ridge_predictions(gram, kept, y[kept], block, num_features), y[block])
    best = validation.argmin(dim=0)  # each state dimension's own strength, (S,)
    errors = _squared_errors(ridge_predictions(gram, fit, y[fit], test, num_features), y[test])  # (K, S)
    error = errors.gather(0, best[None]).squeeze(0)  # (S,)
    total = ((y[test] - y[test].mean(dim=0)) ** 2).sum(dim=0)  # (S,)
    r2 = 1 - error / total
    return torch.where(total > 0, r2, torch.nan).numpy()


def ridge_predictions(gram: torch.Tensor, fit_rows: torch.Tensor, y: torch.Tensor, new_rows: torch.Tensor,
                      num_features: int, strengths: Sequence[float] = RIDGE_STRENGTHS) -> torch.Tensor:
    """The predictions (K, M, S) for `new_rows` (M,) of ridge regressions fit on `fit_rows` (n,) with targets
    y (n, S), one per strength (penalty strength * n), from the Gram matrix (N, N) of all rows' features.

    The features are centred on `rows` and divided by their overall RMS there (one scale for all, so that a feature
    nearly constant on these rows is not blown up); the regression is solved in its dual form, one
    eigendecomposition of the rows' centred Gram matrix (n, n) serving every strength."""
    inner = gram[fit_rows][:, fit_rows]  # (n, n)
    row_means, mean = inner.mean(dim=1), inner.mean()
    centred = inner - row_means[:, None] - row_means[None, :] + mean  # (x_i - m) . (x_j - m)
    mean_square = (centred.diagonal().sum() / (len(fit_rows) * num_features)).clamp(min=torch.finfo(gram.dtype).tiny)
    eigenvalues, eigenvectors = torch.linalg.eigh(centred / mean_square)
    y_mean = y.mean(dim=0)
    rotated = eigenvectors.T @ (y - y_mean)  # (n, S)
    cross = gram[new_rows][:, fit_rows]  # (M, n)
    cross = (cross - cross.mean(dim=1, keepdim=True) - row_means[None, :] + mean) / mean_square
    penalties = torch.as_tensor(strengths, dtype=gram.dtype) * len(fit_rows)  # (K,)
    duals = eigenvectors @ (rotated / (eigenvalues.clamp(min=0)[None, :, None] + penalties[:, None, None]))
    return cross @ duals + y_mean  # (K, M, S)


def gram_matrix(features: np.ndarray, block: int = 4096) -> torch.Tensor:
    """X X' (N, N) in float64 of features (N, ...) flattened and centred on all N rows (a shift common to every
    row changes no ridge fit, and keeps the centring on a fit's rows from cancelling digits), accumulated over
    blocks of `block` features."""
    x = torch.as_tensor(features).flatten(1)
    gram = torch.zeros(len(x), len(x), dtype=torch.float64)
    for columns in x.split(block, dim=1):
        columns = columns.double()
        columns = columns - columns.mean(dim=0)
        gram += columns @ columns.T
    return gram


def _squared_errors(predictions: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The summed squared error per strength and target dimension (K, S) of predictions (K, M, S) against y (M, S)."""
    return ((predictions - y) ** 2).sum(dim=1)


def pooled(obs: np.ndarray, pool: int) -> np.ndarray:
    """Observations as features: pixels (N, C, H, W) average-pooled to (N, C * pool * pool) in [0, 1]; states
    (N, S) as they are."""
    if obs.ndim == 2:
        return obs.astype(np.float32)
    frames = torch.as_tensor(obs, dtype=torch.float32) / 255.0
    return F.adaptive_avg_pool2d(frames, pool).flatten(1).numpy()


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
    of `method` (the agent config it was pre-trained with, e.g. proto_paper) after `pretrain_frames` frames."""

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
        task = config.get("pretrain_env") or config["env"]
        settings = dict(obs=spec["obs_type"], image_size=config["image_size"], frame_stack=config["frame_stack"],
                        action_repeat=spec["action_repeat"], camera_id=config.get("camera_id"))
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
    """The agent config a snapshot's run was started with (`proto_paper`, `proto`, ...) when the snapshot lies in
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
    from protorl.results.stats import require_rliable

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
