"""Figure 1's maps: the state-visitation heat map of the point-mass arena, the maze walls, and each prototype
drawn at the replay state whose embedding is closest to it; beside it, for Proto-RL, the reward field: the
intrinsic reward the agent would get now for the point at rest at each cell (what its reward rewards).

The walls are every box geom of the world body in the environment's own model (the U-maze's three walls;
point_mass has none), so the drawing follows the model. Prototype j is placed at the stored physical
state of argmax_i z_i . c_j over a sample of replay observations (z and c unit-norm: the nearest in L2).
"""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch

from protorl.exploration.coverage import CoverageSpec

MAP_DOMAINS = ("point_mass", "point_mass_maze")  # domains whose coverage coordinates are the arena's (x, y)
FIGURE_INCHES = (4.8, 4.4)  # one map; every map has the same pixel size, so they animate
FIGURE_DPI = 100
ANIMATION_FRAME_MS = 500


def wall_rectangles(physics) -> list[tuple[float, float, float, float]]:
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


def inside_walls(xy: np.ndarray, walls: list[tuple[float, float, float, float]]) -> np.ndarray:
    """Whether each point (N, 2) lies inside a wall rectangle: (N,) bool."""
    inside = np.zeros(len(xy), dtype=bool)
    for x0, y0, x1, y1 in walls:
        inside |= (xy[:, 0] >= x0) & (xy[:, 0] <= x1) & (xy[:, 1] >= y0) & (xy[:, 1] <= y1)
    return inside


def reward_field(score, env, spec: CoverageSpec, walls: list[tuple[float, float, float, float]]) -> np.ndarray:
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


def render_map(counts: np.ndarray, spec: CoverageSpec, walls: list[tuple[float, float, float, float]],
               prototype_xy: np.ndarray | None, title: str, reward: np.ndarray | None = None) -> np.ndarray:
    """Heat map of `counts` (bins, bins) over (x, y), walls in grey, prototypes (M, 2) in red, and beside it the
    reward field (bins, bins) if given -> RGB (H, W, 3). An all-NaN field (no reward yet) keeps its panel, empty,
    so that every map of a run has the same size."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    panels = 1 if reward is None else 2
    fig = Figure(figsize=(FIGURE_INCHES[0] * panels, FIGURE_INCHES[1]), dpi=FIGURE_DPI, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    extent = (spec.low[0], spec.high[0], spec.low[1], spec.high[1])
    image = axes[0].imshow(np.log1p(counts.T), origin="lower", extent=extent, cmap="Blues", interpolation="nearest")
    fig.colorbar(image, ax=axes[0], label="log(1 + visits)")
    if prototype_xy is not None:
        axes[0].scatter(prototype_xy[:, 0], prototype_xy[:, 1], s=12, c="red", edgecolors="darkred", linewidths=0.4,
                        label="prototypes (closest state)")
        axes[0].legend(loc="lower right", fontsize=7)
    axes[0].set_title(title)
    if reward is not None and np.isnan(reward).all():
        axes[1].set_title("k-NN reward: none yet (too few candidates)")
    elif reward is not None:
        image = axes[1].imshow(reward.T, origin="lower", extent=extent, cmap="magma", interpolation="nearest")
        fig.colorbar(image, ax=axes[1], label="intrinsic reward")
        axes[1].set_title("k-NN reward of the point at rest, now")
    for ax in axes:
        for x0, y0, x1, y1 in walls:
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, facecolor="0.35", edgecolor="black"))
        ax.set(xlim=extent[:2], ylim=extent[2:], xlabel=f"{spec.labels[0]} (m)", ylabel=f"{spec.labels[1]} (m)",
               aspect="equal")
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def map_paths(map_dir: Path, up_to_frames: int) -> list[Path]:
    """`map_<frames>.png` files of `map_dir` with frames <= `up_to_frames`, in frame order."""
    paths = [(int(p.stem.split("_")[1]), p) for p in map_dir.glob("map_*.png") if p.stem.split("_")[1].isdigit()]
    return [p for frames, p in sorted(paths) if frames <= up_to_frames]


def write_animation(paths: list[Path], out: Path) -> Path:
    """A looping GIF of the PNG maps `paths`, `ANIMATION_FRAME_MS` per map."""
    iio.imwrite(out, np.stack([iio.imread(p)[..., :3] for p in paths]), duration=ANIMATION_FRAME_MS, loop=0)
    return out
