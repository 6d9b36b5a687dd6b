"""Figure 1's maps: the state-visitation heat map of the point-mass arena, the maze walls, and each prototype
drawn at the replay state whose embedding is closest to it; beside it, for Proto-RL, the reward field: the
intrinsic reward the agent would get now for the point at rest at each cell (what its reward rewards).

The walls are every box geom of the world body in the environment's own model (the U-maze's three walls;
point_mass has none), so the drawing follows the model. Prototype j is placed at the stored physical
state of argmax_i z_i . c_j over a sample of replay observations (z and c unit-norm: the nearest in L2).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
import torch.nn.functional as F

from protorl.agents.capabilities import Prototypes
from protorl.envs import make_env
from protorl.exploration.analysis import Analysis, AnalysisContext, LoggedRun, Moment, Report
from protorl.exploration.coverage import CoverageSpec
from protorl.exploration.reward_variance import embed

MAP_DOMAINS = ("point_mass", "point_mass_maze")  # domains whose coverage coordinates are the arena's (x, y)
FIGURE_INCHES = (4.8, 4.4)  # one map; every map has the same pixel size, so they animate
FIGURE_DPI = 100
ANIMATION_FRAME_MS = 500
Bounds = tuple[float, float, float, float]  # (x_min, y_min, x_max, y_max), metres


@dataclass(frozen=True)
class Landmarks:
    """What a map marks besides the walls: where episodes start and the targets of the run's tasks (metres)."""

    start: Bounds | None = None
    targets: dict[str, tuple[float, float]] = field(default_factory=dict)  # task name -> (x, y)
    target_radius: float = 0.0  # the reward's radius around a target


def landmarks(domain: str, tasks: Sequence[str]) -> Landmarks:
    """The U-maze's start square and the targets among `tasks` (the run's downstream tasks); none elsewhere."""
    from protorl.envs import point_mass_maze as maze

    if domain != maze.DOMAIN:
        return Landmarks()
    suffixes = {task: task.removeprefix(f"{maze.DOMAIN}_") for task in tasks}
    targets = {task: maze.TARGETS[suffix] for task, suffix in suffixes.items() if suffix in maze.TARGETS}
    return Landmarks((*maze.START_LOW, *maze.START_HIGH), targets, maze.TARGET_RADIUS)


def wall_rectangles(physics) -> list[Bounds]:
    """(x_min, y_min, x_max, y_max) of every box geom attached to the world body, in metres."""
    import mujoco

    model = physics.model
    walls = []
    for geom in range(model.ngeom):
        if model.geom_bodyid[geom] != 0 or model.geom_type[geom] != mujoco.mjtGeom.mjGEOM_BOX:
            continue
        rotation = np.empty(9)
        mujoco.mju_quat2Mat(rotation, model.geom_quat[geom])
        half = np.abs(rotation.reshape(3, 3)) @ model.geom_size[geom]  # world-frame half extents (3,)
        x, y = model.geom_pos[geom][:2]
        walls.append((x - half[0], y - half[1], x + half[0], y + half[1]))
    return walls


def closest_samples(z: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """For each prototype, the sample whose projection is closest: z (N, D), prototypes (M, D) -> (M,) index."""
    return (prototypes @ z.t()).argmax(dim=1)


def cell_centres(spec: CoverageSpec) -> np.ndarray:
    """The (x, y) centre of every cell of a 2-d coverage grid, in the histogram's order: (bins * bins, 2)."""
    edges = [np.linspace(spec.low[i], spec.high[i], spec.bins + 1) for i in range(2)]
    centres = [(e[:-1] + e[1:]) / 2 for e in edges]
    return np.stack(np.meshgrid(*centres, indexing="ij"), axis=-1).reshape(-1, 2)


def inside_walls(xy: np.ndarray, walls: list[Bounds]) -> np.ndarray:
    """Whether each point (N, 2) lies inside a wall rectangle: (N,) bool."""
    inside = np.zeros(len(xy), dtype=bool)
    for x0, y0, x1, y1 in walls:
        inside |= (xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)
    return inside


def reward_field(score, env, spec: CoverageSpec, walls: list[Bounds]) -> np.ndarray:
    """The intrinsic reward of the point at rest at each cell centre, (bins, bins), NaN inside the walls.

    score: observations (N, *obs_shape) -> rewards (N,) (the agent's reward against its queue now);
    env: an environment of the run's task and observation settings, used only for this.
    """
    xy = cell_centres(spec)
    free = ~inside_walls(xy, walls)
    state = np.zeros(env.physical_state_shape)
    observations = []
    for point in xy[free]:
        state[spec.columns] = point
        observations.append(env.observe_at(state))
    field = np.full(len(xy), np.nan)
    field[free] = score(np.stack(observations))
    return field.reshape(spec.shape)


def render_map(counts: np.ndarray, spec: CoverageSpec, walls: list[Bounds], prototype_xy: np.ndarray | None,
               frames: int, reward: np.ndarray | None = None, marks: Landmarks | None = None) -> np.ndarray:
    """Heat map of `counts` (bins, bins) over (x, y) after `frames` frames, walls in grey, prototypes (M, 2) in
    red, the start and targets of `marks`, and beside it the reward field (bins, bins) if given -> RGB (H, W, 3).
    An all-NaN field (no reward yet) keeps its panel, empty, so that every map of a run has the same size."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = 1 if reward is None else 2
    fig = Figure(figsize=(FIGURE_INCHES[0] * panels, FIGURE_INCHES[1]), dpi=FIGURE_DPI, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    extent = (spec.low[0], spec.high[0], spec.low[1], spec.high[1])
    image = axes[0].imshow(np.log1p(counts.T), origin="lower", extent=extent, cmap="Blues", interpolation="nearest")
    fig.colorbar(image, ax=axes[0], label="log(1 + visits to the cell)")
    if prototype_xy is not None:
        axes[0].scatter(prototype_xy[:, 0], prototype_xy[:, 1], s=12, c="red", edgecolors="darkred", linewidths=0.4,
                        label="prototype (at its closest visited state)")
    axes[0].set_title(f"where the agent went in {frames} frames")
    if reward is not None and np.isnan(reward).all():
        axes[1].set_title("its exploration reward: none yet (too few candidates)")
    elif reward is not None:
        image = axes[1].imshow(reward.T, origin="lower", extent=extent, cmap="magma", interpolation="nearest")
        fig.colorbar(image, ax=axes[1], label="k-NN reward of the point at rest there\n(higher: less explored)")
        axes[1].set_title("the exploration reward it would get now")
    for ax in axes:
        _draw_walls_and_marks(ax, walls, marks or Landmarks())
        ax.set(xlim=extent[:2], ylim=extent[2:], xlabel=f"{spec.labels[0]} (m)", ylabel=f"{spec.labels[1]} (m)",
               aspect="equal")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _draw_walls_and_marks(ax, walls: list[Bounds], marks: Landmarks) -> None:
    """The walls in grey, the start square dashed, each target as its reward disc with a star at its centre."""
    from matplotlib.patches import Circle, Rectangle

    for x0, y0, x1, y1 in walls:
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, facecolor="0.35", edgecolor="black"))
    if marks.start is not None:
        x0, y0, x1, y1 = marks.start
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="lime", linestyle="--",
                         linewidth=2, label="start: episodes begin in this square"))
    for task, (x, y) in marks.targets.items():
        ax.add_patch(Circle((x, y), marks.target_radius, fill=False, edgecolor="gold", linewidth=1.5))
        ax.scatter([x], [y], marker="*", s=120, c="gold", edgecolors="black", linewidths=0.6, zorder=3,
                   label=f"target of {task} (reward within {marks.target_radius * 100:.0f} cm)")


def map_paths(map_dir: Path, up_to_frames: int) -> list[Path]:
    """`map_<frames>.png` files of `map_dir` with frames <= `up_to_frames`, in frame order."""
    paths = [(int(p.stem.split("_")[1]), p) for p in map_dir.glob("map_*.png") if p.stem.split("_")[1].isdigit()]
    return [p for frames, p in sorted(paths) if frames <= up_to_frames]


def write_animation(paths: list[Path], out: Path) -> Path:
    """A looping GIF of the PNG maps `paths`, `ANIMATION_FRAME_MS` per map."""
    iio.imwrite(out, np.stack([iio.imread(p)[..., :3] for p in paths]), duration=ANIMATION_FRAME_MS, loop=0)
    return out


class VisitationMap(Analysis):
    """Figure 1's map at each analysis, for the point-mass arenas: `maps/map_<frames>.png` (and TensorBoard's image
    `maps/visitation`), where the agent went and, for an agent with prototypes, where its prototypes sit and the
    reward field beside it; at the phase's end `maps/maps.gif`. It writes no column."""

    outputs = ("map.png",)

    def __init__(self, context: AnalysisContext):
        super().__init__(context)
        env, spec = context.env, context.visits.spec
        self.map_dir = context.out_dir / "maps"
        draws = spec is not None and env.domain in MAP_DOMAINS  # a spec: a simulated domain
        self.walls = wall_rectangles(env.physics) if draws else None
        self.landmarks = landmarks(env.domain, context.downstream_tasks) if draws else None
        # renders the reward field's observations, apart from the training environment
        self.reward_env = make_env(env.task, context.env_cfg, seed=context.seed) \
            if draws and isinstance(context.agent, Prototypes) else None

    def measure(self, moment: Moment) -> dict[str, float]:
        if self.walls is None:
            return {}
        agent, replay, spec = self.context.agent, self.context.replay, self.context.visits.spec
        prototype_xy = reward = None
        if moment.projections is not None and len(replay) > 0:
            ends = replay.sample_indices(self.context.cfg.map_samples, moment.rng)
            closest = closest_samples(F.normalize(moment.projections.at(ends), dim=1), agent.prototypes)
            states = replay.physical_states[ends[closest.cpu().numpy()] % replay.capacity]
            prototype_xy = states[:, spec.columns]  # (M, 2)
        if self.reward_env is not None:  # before the queue holds k candidates, an empty panel of the same size
            reward = (reward_field(self._score, self.reward_env, spec, self.walls) if agent.can_score
                      else np.full(spec.shape, np.nan))
        image = render_map(self.context.visits.counts, spec, self.walls, prototype_xy, moment.frames, reward,
                           self.landmarks)
        self.map_dir.mkdir(parents=True, exist_ok=True)
        iio.imwrite(self.map_dir / f"map_{moment.frames}.png", image)
        self.context.logger.log_image("maps/visitation", image, moment.frames)
        return {}

    @torch.no_grad()
    def _score(self, obs: np.ndarray) -> np.ndarray:
        """The agent's intrinsic reward of observations (N, *obs_shape) against its queue now, unchanged: (N,)."""
        return self.context.agent.score(embed(self.context.agent, obs)).squeeze(1).cpu().numpy()

    def finish(self, frames: int) -> None:
        paths = map_paths(self.map_dir, frames)
        if paths:
            write_animation(paths, self.map_dir / "maps.gif")

    def reset(self) -> None:
        for path in map_paths(self.map_dir, self.context.total_frames) if self.map_dir.is_dir() else []:
            path.unlink()

    @classmethod
    def report(cls, run: LoggedRun) -> Report:
        """map.png: the latest map, if any; and the animation of them all."""
        maps = [run.verified(path) for path in map_paths(run.phase_dir / "maps", up_to_frames=math.inf)[-1:]]
        written = [Path(shutil.copyfile(maps[-1], run.out_dir / "map.png"))] if maps else []
        if (run.phase_dir / "maps" / "maps.gif").is_file():
            written.append(run.phase_dir / "maps" / "maps.gif")
        return Report(written=written)
