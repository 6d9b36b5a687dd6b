"""The paper's PointMass U-maze (appendix E): point_mass easy with three walls and a top-left start.

Model: the suite's `point_mass.xml` with appendix E's three walls added verbatim (a `wall` default class
of semi-transparent `site`-material boxes). The suite disables contacts, which would let the point pass
through the walls, so contacts are enabled; the ground and the target marker get `contype=conaffinity=0`,
so the point (radius 0.01) collides only with the maze walls and the arena's border planes.

Geometry in world coordinates (metres; the point's centre is its (root_x, root_y) joint position,
limited to [-0.29, 0.29] by the suite's joint ranges; +x is right and +y is up in camera 0's image):

- `maze_x`:     x in [-0.12, -0.08], y in [-0.10, 0.10]   (left wall)
- `maze_neg_x`: x in [ 0.08,  0.12], y in [-0.10, 0.10]   (right wall)
- `maze_y`:     x in [-0.12,  0.12], y in [ 0.10, 0.14]   (top wall)

Together an upside-down U around the centre, open at the bottom (y < -0.1). The start (uniform over
x in [-0.3, -0.15], y in [0.15, 0.3], zero velocity, drawn from the task's seeded `random`; a start
beyond the +-0.29 joint range is pushed back by the joint limit in the first steps) is the top-left
square, so reaching the centre means going down the left corridor, under the walls and up into the U.

Tasks (domain `point_mass_maze`, 1000 control steps of 0.02 s = the suite's 20 s time limit):

- `point_mass_maze_explore`: reward 0 always, for task-agnostic pre-training; no target is drawn.
- `point_mass_maze_reach_<target>`: sparse, reward 1.0 while the distance from the point's centre to
  the target is < 0.07, else 0.0. The suite's target sphere (radius 0.015, no collision) marks it.
  Targets: `center` (0, 0) (appendix E), and the four corners of the arena, `top_left` (-0.2, 0.2),
  `top_right` (0.2, 0.2), `bottom_left` (-0.2, -0.2), `bottom_right` (0.2, -0.2). The arena's corners
  are open floor: each corner target is >= 0.1 from the nearest wall point (walls span |x| <= 0.12,
  y in [-0.1, 0.14]), so its whole 0.07 disc is free for the point (radius 0.01) and inside the joint
  range; the centre's disc exactly fits the U's 0.16-wide inside. `top_left` lies in the start square
  (an easy control task); `top_right` is reached over the top wall, `bottom_left` down the left
  corridor, `bottom_right` down the left corridor and under the U.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from functools import cache, partial

import numpy as np

from protorl.envs.dmc import ExtraTask, _suite, register_task

DOMAIN = "point_mass_maze"

# Appendix E, verbatim.
_WALL_CLASS_XML = '<default class="wall"><geom type="box" material="site"/></default>'
_WALL_GEOMS_XML = """<worldbody>
<geom name="maze_x" class="wall" pos="-.1 0 .02" zaxis="1 0 0"  size=".02 .1 .02"/>
<geom name="maze_neg_x" class="wall" pos=".1 0 .02" zaxis="1 0 0"  size=".02 .1 .02"/>
<geom name="maze_y" class="wall" pos="0 .12 .02" zaxis="0 1 0"  size=".12 .02 .02"/>
</worldbody>"""

START_LOW = (-0.3, 0.15)  # (x, y) lower corner of the initial-position square, metres
START_HIGH = (-0.15, 0.3)  # (x, y) upper corner
TARGET_RADIUS = 0.07  # metres: reward 1 strictly inside this distance of the target
TARGETS: dict[str, tuple[float, float]] = {  # task suffix -> target (x, y), metres
    "reach_center": (0.0, 0.0),
    "reach_top_left": (-0.2, 0.2),
    "reach_top_right": (0.2, 0.2),
    "reach_bottom_left": (-0.2, -0.2),
    "reach_bottom_right": (0.2, -0.2),
}
TIME_LIMIT = 20.0  # seconds: 1000 control steps of the model's 0.02 s timestep
_NO_COLLISION = {"contype": "0", "conaffinity": "0"}


def maze_xml(suite_xml: bytes, target: tuple[float, float] | None) -> bytes:
    """The suite's point-mass XML with the maze walls and contacts on, and the target marker moved to
    `target` (x, y), or removed if None."""
    root = ET.fromstring(suite_xml)
    option = root.find("option")
    option.remove(option.find("flag"))  # the suite's <flag contact="disable"/>
    root.find("default").append(ET.fromstring(_WALL_CLASS_XML))
    worldbody = root.find("worldbody")
    worldbody.find("geom[@name='ground']").attrib.update(_NO_COLLISION)
    marker = worldbody.find("geom[@name='target']")
    if target is None:
        worldbody.remove(marker)
    else:
        marker.attrib.update(_NO_COLLISION, pos=f"{target[0]} {target[1]} .01")
    body_index = list(worldbody).index(worldbody.find("body[@name='pointmass']"))
    for offset, wall in enumerate(ET.fromstring(_WALL_GEOMS_XML)):
        worldbody.insert(body_index + offset, wall)
    return ET.tostring(root)


def reach_reward(position: np.ndarray, target: tuple[float, float]) -> float:
    """1.0 if the point's (x, y) `position` is closer than `TARGET_RADIUS` to `target`, else 0.0."""
    return float(np.linalg.norm(np.asarray(position)[:2] - np.asarray(target)) < TARGET_RADIUS)


@cache
def _task_class() -> type:
    """The dm_control task class, built on first use so that importing this module skips dm_control."""
    from dm_control.suite import base

    class PointMassMaze(base.Task):
        """The U-maze: a top-left start with zero velocity; sparse reach reward, or none if no target."""

        def __init__(self, target: tuple[float, float] | None, random: int):
            self.target = target
            super().__init__(random=random)

        def initialize_episode(self, physics) -> None:
            physics.named.data.qpos[["root_x", "root_y"]] = self.random.uniform(START_LOW, START_HIGH)
            physics.data.qvel[:] = 0.0
            super().initialize_episode(physics)

        def get_observation(self, physics) -> dict[str, np.ndarray]:
            """The suite's point-mass observation: position (2,) and velocity (2,)."""
            return {"position": physics.position(), "velocity": physics.velocity()}

        def get_reward(self, physics) -> float:
            if self.target is None:
                return 0.0
            return reach_reward(physics.named.data.geom_xpos["pointmass"], self.target)

    return PointMassMaze


def load(target: tuple[float, float] | None, seed: int):
    """A dm_control `control.Environment` of the maze with `target` (None: the exploration task)."""
    _suite()  # chooses the rendering backend before dm_control is imported
    from dm_control.rl import control
    from dm_control.suite import point_mass

    suite_xml, assets = point_mass.get_model_and_assets()
    physics = point_mass.Physics.from_xml_string(maze_xml(suite_xml, target), assets)
    return control.Environment(physics, _task_class()(target, random=seed), time_limit=TIME_LIMIT)


DESCRIPTIONS = {  # task suffix -> what earns its reward (protorl-tasks)
    "explore": "no reward: task-agnostic pre-training",
    "reach_center": "reach the centre, inside the U (sparse)",
    "reach_top_left": "reach the top-left corner, in the start square (sparse)",
    "reach_top_right": "reach the top-right corner, over the top wall (sparse)",
    "reach_bottom_left": "reach the bottom-left corner, down the left corridor (sparse)",
    "reach_bottom_right": "reach the bottom-right corner, under the U (sparse)",
}
register_task(f"{DOMAIN}_explore", ExtraTask(DOMAIN, partial(load, None), description=DESCRIPTIONS["explore"]))
for _suffix, _target in TARGETS.items():
    register_task(f"{DOMAIN}_{_suffix}", ExtraTask(DOMAIN, partial(load, _target), description=DESCRIPTIONS[_suffix]))
