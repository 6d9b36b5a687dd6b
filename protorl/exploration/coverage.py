"""State coverage (section 5.6, after Hazan et al. 2019): the normalised entropy of a discretised
state-visitation histogram.

Each domain names the physical coordinates that define "where the system is" (`COVERAGE_DIMS`); each
coordinate is read from the simulator's state vector (`physics.get_state()`: qpos, qvel, act), wrapped
to [-pi, pi) if it is an angle (or, for a free body's uprightness, computed from its orientation quaternion),
and cut into `bins` equal bins over its range (a limited joint's range is read from the model; positions
beyond a range fall into its edge bins). The histogram has bins ** d cells and

    coverage_entropy = H(p) / log(bins ** d),   p = counts / counts.sum(),

1 for uniform visits of every cell, 0 when every state falls in one cell. Cells that the system cannot
reach (inside the maze's walls, a lying walker's torso above 1 m) keep the maximum below 1: compare
agents on the same domain and bins, not across domains. `visited_fraction` is the share of cells with
at least one visit. Everything here is a pure function of the states: deterministic given a buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CoverageDim:
    """One coordinate: a joint's position (or velocity), over [low, high] or the joint's limits."""

    label: str
    joint: str  # the MuJoCo joint's name
    low: float | None = None  # None (with high): the joint's range in the model, which must be limited
    high: float | None = None
    periodic: bool = False  # an angle: wrapped into [-pi, pi), binned over it
    velocity: bool = False  # the joint's velocity (qvel) instead of its position (qpos)
    offset: int = 0  # which of the joint's coordinates: a free joint's x, y, z are 0, 1, 2, its quaternion's w 3
    upright: bool = False  # at a free joint's quaternion (offset 3): the world-z part of its body's z axis


_PLANAR_X = (-10.0, 10.0)  # metres: torso x of walker/cheetah/hopper, x and y of the quadruped (0 at reset)
COVERAGE_DIMS: dict[str, tuple[CoverageDim, ...]] = {
    # The point's centre in the arena plane, over the slide joints' range (+-0.29 m): figure 1's map.
    "point_mass": (CoverageDim("x", "root_x"), CoverageDim("y", "root_y")),
    "point_mass_maze": (CoverageDim("x", "root_x"), CoverageDim("y", "root_y")),
    # Planar bodies: torso x, torso height relative to the model's pose (0 = standing, about -1.2 lying
    # for walker) and torso pitch, so standing, lying, flipping and running away all count.
    "walker": (CoverageDim("torso x", "rootx", *_PLANAR_X), CoverageDim("torso z", "rootz", -1.3, 0.5),
               CoverageDim("torso angle", "rooty", periodic=True)),
    "cheetah": (CoverageDim("torso x", "rootx", *_PLANAR_X), CoverageDim("torso z", "rootz", -0.6, 0.6),
                CoverageDim("torso angle", "rooty", periodic=True)),
    "hopper": (CoverageDim("torso x", "rootx", *_PLANAR_X), CoverageDim("torso z", "rootz", -1.2, 0.6),
               CoverageDim("torso angle", "rooty", periodic=True)),
    "cartpole": (CoverageDim("cart x", "slider"), CoverageDim("pole angle", "hinge_1", periodic=True)),
    "pendulum": (CoverageDim("angle", "hinge", periodic=True),
                 CoverageDim("angular velocity", "hinge", -8.0, 8.0, velocity=True)),
    "acrobot": (CoverageDim("shoulder", "shoulder", periodic=True), CoverageDim("elbow", "elbow", periodic=True)),
    "reacher": (CoverageDim("shoulder", "shoulder", periodic=True), CoverageDim("wrist", "wrist")),
    "finger": (CoverageDim("proximal", "proximal"), CoverageDim("distal", "distal"),
               CoverageDim("spinner", "hinge", periodic=True)),
    # The torso's position on the floor, its height (about 0.2 m on its back, 0.5 m standing, up to 1 m in a jump
    # or as an episode starts) and its uprightness (1 upright, -1 on its back): walking away, standing, jumping and
    # falling all count.
    "quadruped": (CoverageDim("torso x", "root", *_PLANAR_X), CoverageDim("torso y", "root", *_PLANAR_X, offset=1),
                  CoverageDim("torso z", "root", 0.0, 1.2, offset=2),
                  CoverageDim("torso upright", "root", -1.0, 1.0, offset=3, upright=True)),
    # The arm's base yaw, shoulder and elbow: they place the hand.
    "reach_duplo": (CoverageDim("base yaw", "jaco_arm/joint_1", periodic=True),
                    CoverageDim("shoulder", "jaco_arm/joint_2"), CoverageDim("elbow", "jaco_arm/joint_3")),
}


@dataclass(frozen=True)
class CoverageSpec:
    """Where each coordinate sits in a physical-state vector, and the range its bins cover."""

    labels: tuple[str, ...]
    columns: np.ndarray  # (d,) int: index into the state vector (an uprightness's: its quaternion's w)
    low: np.ndarray  # (d,) float
    high: np.ndarray  # (d,) float
    periodic: np.ndarray  # (d,) bool
    bins: int  # per coordinate
    upright: np.ndarray | None = None  # (d,) bool: the coordinate is a free body's uprightness; None: none is

    @property
    def shape(self) -> tuple[int, ...]:
        """The histogram's shape: (bins,) * d."""
        return (self.bins,) * len(self.labels)


def coverage_spec(domain: str, physics, bins: int) -> CoverageSpec | None:
    """The domain's coverage coordinates resolved against its model; None if `COVERAGE_DIMS` has none."""
    dims = COVERAGE_DIMS.get(domain)
    if dims is None:
        return None
    model = physics.model
    columns, lows, highs = [], [], []
    for dim in dims:
        joint = model.name2id(dim.joint, "joint")
        columns.append((model.nq + model.jnt_dofadr[joint] if dim.velocity else model.jnt_qposadr[joint])
                       + dim.offset)
        if dim.periodic:
            low, high = -math.pi, math.pi
        elif dim.low is not None:
            low, high = dim.low, dim.high
        elif model.jnt_limited[joint]:
            low, high = model.jnt_range[joint]
        else:
            raise ValueError(f"coverage coordinate {dim.label!r} of {domain}: joint {dim.joint!r} has no limits")
        lows.append(low)
        highs.append(high)
    return CoverageSpec(tuple(d.label for d in dims), np.asarray(columns), np.asarray(lows, dtype=np.float64),
                        np.asarray(highs, dtype=np.float64), np.asarray([d.periodic for d in dims]), bins,
                        np.asarray([d.upright for d in dims]))


def coordinates(states: np.ndarray, spec: CoverageSpec) -> np.ndarray:
    """Physical states (N, S) -> each state's coverage coordinates (N, d): angles wrapped into [-pi, pi),
    uprightness computed from the quaternions."""
    x = states[:, spec.columns]  # (N, d)
    x = np.where(spec.periodic, np.mod(x + math.pi, 2 * math.pi) - math.pi, x)
    if spec.upright is not None and spec.upright.any():  # R_zz of the unit quaternion (w, x, y, z): 1 - 2 (x² + y²)
        quaternion_xy = states[:, spec.columns[spec.upright, None] + np.array([1, 2])]  # (N, k, 2)
        x[:, spec.upright] = 1 - 2 * (quaternion_xy ** 2).sum(-1)
    return x


def bin_indices(states: np.ndarray, spec: CoverageSpec) -> np.ndarray:
    """Physical states (N, S) -> flat histogram cell of each (N,) int64."""
    cells = np.floor((coordinates(states, spec) - spec.low) / (spec.high - spec.low) * spec.bins).astype(np.int64)
    cells = np.clip(cells, 0, spec.bins - 1)  # (N, d); out-of-range values go to the edge bins
    return np.ravel_multi_index(tuple(cells.T), spec.shape)


def histogram(states: np.ndarray, spec: CoverageSpec) -> np.ndarray:
    """Visit counts of physical states (N, S) -> (bins ** d,) int64."""
    return np.bincount(bin_indices(states, spec), minlength=math.prod(spec.shape))


def coverage_entropy(counts: np.ndarray) -> float:
    """Entropy of the visit distribution over the cells of `counts` (any shape) / log(#cells), in [0, 1].

    0.0 for no visits. E.g. counts [2, 1, 1, 0]: p = (1/2, 1/4, 1/4, 0), H = 1.5 log 2, / log 4 = 0.75.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    if counts.size < 2:
        raise ValueError(f"coverage needs at least 2 cells, got {counts.size}")
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum() / math.log(counts.size))


def visited_fraction(counts: np.ndarray) -> float:
    """Share of the cells of `counts` visited at least once, in [0, 1]."""
    return float(np.count_nonzero(counts) / np.size(counts))
