"""The state probe's frames and regression: what features know of the environment's physical state.

A uniform-random policy with a fixed seed collects observations of a task, in short episodes (many starting points),
with their physical states (MuJoCo's qpos and qvel: for the U-maze the point's x, y and velocity). A ridge
regression from features (centred, one scale for all) to states is fit on the first `1 - test_fraction` of them
(each state dimension's strength chosen by 5-fold cross-validation on those) and scored on the rest: R^2 per state
dimension. Used during pre-training (the analyses' in-run probe) and on snapshots (`protorl.reports.probe`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from protorl.agents.capabilities import Prototypes
from protorl.envs import DMCEnv, Simulated
from protorl.exploration.analysis import Analysis, AnalysisContext, LoggedRun, Moment, Report

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


class StateProbe(Analysis):
    """The in-run state probe (`analyses.probe_samples`): the mean R^2 of a ridge regression from the online
    encoder's features (and, for an agent with prototypes, the projections) to the physical state, on fixed
    uniform-random frames of the phase's task collected at the first analysis; nothing without a simulator's
    states."""

    columns = ("probe/encoder_r2", "probe/projection_r2")
    CHUNK = 256  # frames encoded at once

    def __init__(self, context: AnalysisContext):
        super().__init__(context)
        self.frames: ProbeFrames | None = None

    @torch.no_grad()
    def measure(self, moment: Moment) -> dict[str, float]:
        context = self.context
        if context.cfg.probe_samples is None or not isinstance(context.env, Simulated):
            return {}
        if self.frames is None:
            env_cfg = context.env_cfg
            self.frames = collect_frames(context.env.task, context.cfg.probe_samples, context.seed, obs=env_cfg.obs,
                                         image_size=env_cfg.image_size, frame_stack=env_cfg.frame_stack,
                                         action_repeat=env_cfg.action_repeat, camera_id=env_cfg.camera_id)
        agent, obs, states = context.agent, self.frames.obs, self.frames.states
        chunks = [torch.as_tensor(obs[i:i + self.CHUNK], device=agent.device) for i in range(0, len(obs), self.CHUNK)]
        row = {"probe/encoder_r2": float(np.nanmean(ridge_r2(
            torch.cat([agent.encoder(chunk).float().cpu() for chunk in chunks]).numpy(), states)))}
        if isinstance(agent, Prototypes):
            projections = F.normalize(agent.embed(torch.as_tensor(obs, device=agent.device)), dim=1)
            row["probe/projection_r2"] = float(np.nanmean(ridge_r2(projections.float().cpu().numpy(), states)))
        return row

    @classmethod
    def report(cls, run: LoggedRun) -> Report:
        """Its mean R^2 at each analysis, if it ran (`analyses.probe_samples`)."""
        probed = [row for row in run.rows if "probe/encoder_r2" in row]
        if not probed:
            return Report()
        lines = ["  state probe (mean R^2 of a linear read-out of the physical state, docs/probe.md):"]
        at = ", ".join(str(int(row["frames"])) for row in probed)
        for key, what in (("probe/encoder_r2", "encoder"), ("probe/projection_r2", "projection")):
            if any(key in row for row in probed):
                values = ", ".join(f"{row[key]:.3f}" for row in probed if key in row)
                lines.append(f"    {what:<10} at {at} frames: {values}")
        return Report(lines)
