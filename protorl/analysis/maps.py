"""Figure 1's maps: the state-visitation heat map of the point-mass arena, the maze walls, and each prototype
drawn at the replay state whose embedding is closest to it.

The walls are every box geom of the world body in the environment's own model (the U-maze's three walls;
point_mass has none), so the drawing follows the model. Prototype j is placed at the stored physical
state of argmax_i z_i . c_j over a sample of replay observations (z and c unit-norm: the nearest in L2).
"""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch

from protorl.analysis.coverage import CoverageSpec

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


def render_map(counts: np.ndarray, spec: CoverageSpec, walls: list[tuple[float, float, float, float]],
               prototype_xy: np.ndarray | None, title: str) -> np.ndarray:
    """Heat map of `counts` (bins, bins) over (x, y), walls in grey, prototypes (M, 2) in red -> RGB (H, W, 3)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    extent = (spec.low[0], spec.high[0], spec.low[1], spec.high[1])
    image = ax.imshow(np.log1p(counts.T), origin="lower", extent=extent, cmap="Blues", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="log(1 + visits)")
    for x0, y0, x1, y1 in walls:
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, facecolor="0.35", edgecolor="black"))
    if prototype_xy is not None:
        ax.scatter(prototype_xy[:, 0], prototype_xy[:, 1], s=12, c="red", edgecolors="darkred", linewidths=0.4,
                   label="prototypes (closest state)")
        ax.legend(loc="lower right", fontsize=7)
    ax.set(xlim=extent[:2], ylim=extent[2:], xlabel=f"{spec.labels[0]} (m)", ylabel=f"{spec.labels[1]} (m)",
           title=title, aspect="equal")
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
