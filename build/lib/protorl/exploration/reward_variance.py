"""Variance of the k-NN intrinsic reward under two candidate schemes (section 5.6, figure 10).

For a fixed set of probe observations, the reward `knn_reward` (distance to the k-th nearest candidate)
is recomputed with `repeats` independently drawn candidate sets of the same size M x T:

- proto: the agent's scheme. T fresh replay batches of B observations; from each, `sample_candidates`
  draws one candidate per prototype, exactly as `ProtoAgent.enqueue_and_score` refills its queue;
- uniform: M x T observations drawn uniformly from the replay buffer (APT's scheme).

Observations are encoded and projected with the agent's current online encoder and projector, without
augmentation, so the spread is that of the candidate draw alone; distances are measured in the agent's
reward space (`agent.reward_space`). All draws use the caller's generators:
the agent's queue, the replay's sampling RNG and the global RNGs are left untouched (exact resume).
The draws repeat replay observations (10 x 2176 draws from a buffer of a few thousand at 5k frames): each
distinct one is encoded once (`ReplayProjections`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from protorl.agents.capabilities import Prototypes
from protorl.agents.proto.math import knn_reward
from protorl.exploration.analysis import Analysis, AnalysisContext, LoggedRun, Moment, Report
from protorl.plots import Curve, Panel, has, plot_curves, series
from protorl.replay import ReplayBuffer


def embed(agent: Prototypes, obs: np.ndarray) -> torch.Tensor:
    """Observations (N, *obs_shape) -> projections before L2 normalisation (N, D) (`Prototypes.embed`)."""
    return agent.embed(torch.as_tensor(obs, device=agent.device))


class ReplayProjections:
    """Projections before L2 normalisation of the replay's observations, each encoded once while the agent's
    networks stay as they are (one analysis): `at(ends)` equals `embed(agent, replay.stack_at(ends))`.

    The projector sees chunks of the agent's batch size, as `Prototypes.embed` gives it (the last one padded with a
    repeated observation), so each projection comes from a product of the same shape: bit for bit the same for
    draws of whole batches (the analyses'), to float rounding where a draw ends in a chunk of 1-3 rows (which a
    BLAS may compute another way)."""

    GROUP = 32  # chunks encoded per call, bounding the stacked frames in memory (32 x 32 x 63.5 KB at 9x84x84)

    def __init__(self, agent: Prototypes, replay: ReplayBuffer):
        self.agent, self.replay = agent, replay
        self.known = np.empty((0,), dtype=np.int64)  # sorted absolute indices already projected
        self.rows: torch.Tensor | None = None  # (len(known), D), in the order of `known`

    @torch.no_grad()
    def at(self, ends: np.ndarray) -> torch.Tensor:
        """Projections (N, D) of the observations ending at absolute indices `ends` (N,)."""
        new = np.setdiff1d(ends, self.known)
        if len(new):
            chunk = self.agent.cfg.batch_size
            padded = np.concatenate([new, np.repeat(new[-1:], -len(new) % chunk)])
            group = chunk * self.GROUP
            projected = torch.cat([embed(self.agent, self.replay.stack_at(padded[i:i + group]))
                                   for i in range(0, len(padded), group)])[:len(new)]
            known = np.concatenate([self.known, new])
            order = np.argsort(known, kind="stable")
            rows = projected if self.rows is None else torch.cat([self.rows, projected])
            self.known, self.rows = known[order], rows[torch.as_tensor(order, device=rows.device)]
        position = torch.as_tensor(np.searchsorted(self.known, ends), device=self.rows.device)
        return self.rows[position]


def replay_embeddings(agent: Prototypes, replay: ReplayBuffer, count: int, rng: np.random.Generator,
                      projections: ReplayProjections | None = None) -> torch.Tensor:
    """Projections of `count` next-observations drawn uniformly from the replay with `rng`: (count, D)."""
    projections = projections or ReplayProjections(agent, replay)
    return projections.at(replay.sample_indices(count, rng))


@torch.no_grad()
def proto_candidates(agent: Prototypes, replay: ReplayBuffer, rng: np.random.Generator, generator: torch.Generator,
                     projections: ReplayProjections | None = None) -> torch.Tensor:
    """A full queue as the agent fills it: T batches of B, M candidates from each -> (M * T, D)."""
    projections = projections or ReplayProjections(agent, replay)
    batches = [replay_embeddings(agent, replay, agent.cfg.batch_size, rng, projections)
               for _ in range(agent.cfg.candidates_per_prototype)]
    return torch.cat([agent.candidates(raw, generator) for raw in batches])


def spread(rewards: np.ndarray) -> tuple[float, float, float]:
    """Rewards (R, P) of P probes recomputed R times -> means over the probes of each probe's mean, standard
    deviation (population) and coefficient of variation std / mean (0 for a probe whose rewards are all 0)."""
    mean, std = rewards.mean(axis=0), rewards.std(axis=0)  # (P,) each
    cv = np.divide(std, mean, out=np.zeros_like(std), where=mean > 0)
    return float(mean.mean()), float(std.mean()), float(cv.mean())


@torch.no_grad()
def reward_variance(agent: Prototypes, replay: ReplayBuffer, probe_obs: np.ndarray, repeats: int,
                    rng: np.random.Generator, generator: torch.Generator,
                    projections: ReplayProjections | None = None) -> dict[str, float]:
    """The k-NN reward of `probe_obs` (P, *obs_shape) under `repeats` proto and uniform candidate sets ->
    `variance/{proto,uniform}_{mean,std,cv}` (means over the probes, see `spread`). `projections`: the replay's
    projections already computed with the agent as it is (shared with other analyses of the same moment)."""
    projections = projections or ReplayProjections(agent, replay)
    z = agent.reward_points(embed(agent, probe_obs))  # (P, D)
    k, size = agent.cfg.knn_k, agent.queue.capacity
    proto = [knn_reward(z, proto_candidates(agent, replay, rng, generator, projections), k) for _ in range(repeats)]
    uniform = [knn_reward(z, agent.reward_points(replay_embeddings(agent, replay, size, rng, projections)), k)
               for _ in range(repeats)]
    metrics = {}
    for scheme, rewards in (("proto", proto), ("uniform", uniform)):
        mean, std, cv = spread(torch.cat(rewards, dim=1).t().cpu().numpy())  # (R, P)
        metrics.update({f"variance/{scheme}_mean": mean, f"variance/{scheme}_std": std,
                        f"variance/{scheme}_cv": cv})
    return metrics


SCHEMES = {"proto": "prototype-balanced candidates (Proto-RL)", "uniform": "uniform candidates"}
PLOTTED = {"std": "standard deviation", "cv": "coefficient of variation"}


class RewardVariance(Analysis):
    """`reward_variance` at each analysis, on `analyses.variance_probes` observations drawn from the replay at the
    first one and kept (over a resume too); nothing for an agent without prototypes."""

    columns = ("variance/proto_mean", "variance/proto_std", "variance/proto_cv",
               "variance/uniform_mean", "variance/uniform_std", "variance/uniform_cv")
    outputs = ("variance.png",)

    def __init__(self, context: AnalysisContext):
        super().__init__(context)
        self.probes: np.ndarray | None = None  # (P, *obs_shape), drawn at the first analysis

    def measure(self, moment: Moment) -> dict[str, float]:
        agent, replay, cfg = self.context.agent, self.context.replay, self.context.cfg
        if moment.projections is None or len(replay) == 0:
            return {}
        if self.probes is None:
            self.probes = replay.stack_at(replay.sample_indices(cfg.variance_probes, moment.rng))
        generator = torch.Generator(device=agent.device).manual_seed(int(moment.rng.integers(2**62)))
        return reward_variance(agent, replay, self.probes, cfg.variance_repeats, moment.rng, generator,
                               moment.projections)

    def state_dict(self) -> dict:
        return {"probes": None if self.probes is None else torch.from_numpy(self.probes.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.probes = None if state["probes"] is None else state["probes"].numpy()

    @classmethod
    def report(cls, run: LoggedRun) -> Report:
        """variance.png (per-state std and coefficient of variation of the k-NN reward, proto against uniform
        candidates, over frames: the paper's figure 10) and the last figures."""
        rows, missing, written = run.rows, run.missing(cls.columns), []
        if any(has(rows, f"variance/{scheme}_{stat}") for scheme in SCHEMES for stat in PLOTTED):
            panels = []
            for stat, label in PLOTTED.items():
                curves = [Curve(*series(rows, f"variance/{scheme}_{stat}"), name, "o-")
                          for scheme, name in SCHEMES.items() if has(rows, f"variance/{scheme}_{stat}")]
                panels.append(Panel(f"its {label} per probe state", f"{label}\n(lower: a steadier reward)", curves))
            path = run.out_dir / "variance.png"
            plot_curves(panels, [path], "how much the k-NN intrinsic reward of a state varies with the candidates "
                                        "drawn\n(fixed probe states, repeated candidate sets, mean over probes)")
            written.append(path)
        measured = [row for row in rows if all(key in row for key in cls.columns)]
        if not measured:
            unmeasured = rows and not set(cls.columns) & set(missing)
            lines = ["  reward variance: not measured (the agent has no prototypes)"] if unmeasured else []
            return Report(lines, written, missing)
        row = measured[-1]
        lines = [f"  k-NN reward at {row['frames']:.0f} frames, per probe state over repeated candidate sets:"]
        for scheme in SCHEMES:
            mean, std, cv = (row[f"variance/{scheme}_{stat}"] for stat in ("mean", "std", "cv"))
            lines.append(f"    {scheme:<7} mean {mean:.4g}  std {std:.4g}  cv {cv:.4f}")
        mean_cv = {s: sum(r[f"variance/{s}_cv"] for r in measured) / len(measured) for s in SCHEMES}
        ratio = mean_cv["uniform"] / mean_cv["proto"] if mean_cv["proto"] > 0 else math.inf
        lines.append(f"    mean cv over {len(measured)} analyses: proto {mean_cv['proto']:.4f}, "
                     f"uniform {mean_cv['uniform']:.4f} (uniform / proto = {ratio:.2f})")
        return Report(lines, written, missing)
