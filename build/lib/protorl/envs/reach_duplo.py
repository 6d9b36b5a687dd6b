"""Reach Duplo: the paper's single task and its multitask set (appendix F).

dm_control.manipulation's `reach_duplo_features` task (a Jaco arm and hand, a 2x4 Duplo brick on a table).

- `reach_duplo`: the original task, the brick spawned anywhere in the task's workspace (figures 4 and 7).
- The multitask set, with the brick's spawn box shrunk to a point: the brick is placed at (x, y) (metres,
  table frame) and settled by the task's own prop placer; its yaw stays uniformly random as in the original.
  `reach_duplo_top_left` (-0.09, 0.09), `reach_duplo_top_right` (0.09, 0.09),
  `reach_duplo_bottom_left` (-0.09, -0.09), `reach_duplo_bottom_right` (0.09, -0.09).

Reward: the original task's, `tolerance(|tcp - brick|, bounds=(0, 0.05), margin=0.05)` (gaussian
sigmoid): 1 while the hand's tool centre point is within 5 cm of the brick's centre, decaying beyond.
Episodes: 250 control steps of 0.04 s (time limit 10 s). Domain `reach_duplo`.

Observations: the `features` variant (joint positions/velocities/torques, hand pose, brick pose; no
camera observables), so `env.obs=states` gets a flat vector; pixels are rendered by `DMCEnv` from camera 0,
the task's `front_close` camera (the only camera of the composed model). The action (9,) is the arm's
6 joint-velocity and the hand's 3 finger actuators, bounded by the spec; `DMCEnv` maps [-1, 1] onto it.
"""

from __future__ import annotations

from functools import partial

from protorl.envs.dmc import ExtraTask, _suite, register_task

DOMAIN = "reach_duplo"

BRICK_POSITIONS: dict[str, tuple[float, float]] = {  # task name -> brick (x, y), metres
    "reach_duplo_top_left": (-0.09, 0.09),
    "reach_duplo_top_right": (0.09, 0.09),
    "reach_duplo_bottom_left": (-0.09, -0.09),
    "reach_duplo_bottom_right": (0.09, -0.09),
}
EPISODE_STEPS = 250  # control steps per episode (appendix C.1)
FRONT_CAMERA_ID = 0  # `front_close`, the only camera of the composed model


def load(position: tuple[float, float] | None, seed: int):
    """A dm_control `composer.Environment` of `reach_duplo_features` with the brick fixed at `position`
    (None: the original workspace)."""
    _suite()  # chooses the rendering backend before dm_control is imported
    from dm_control import composer
    from dm_control.entities import props
    from dm_control.manipulation import reach
    from dm_control.manipulation.shared import arenas, constants, observations, robots, workspaces

    obs_settings = observations.PERFECT_FEATURES
    workspace = reach._DUPLO_WORKSPACE
    if position is not None:
        height = workspace.target_bbox.lower[2]  # the task's drop height above the table
        spawn = (position[0], position[1], height)
        workspace = workspace._replace(target_bbox=workspaces.BoundingBox(lower=spawn, upper=spawn))
    brick = props.Duplo(observable_options=observations.make_options(obs_settings,
                                                                     observations.FREEPROP_OBSERVABLES))
    task = reach.Reach(arena=arenas.Standard(), arm=robots.make_arm(obs_settings=obs_settings),
                       hand=robots.make_hand(obs_settings=obs_settings), prop=brick, obs_settings=obs_settings,
                       workspace=workspace, control_timestep=constants.CONTROL_TIMESTEP)
    return composer.Environment(task, time_limit=EPISODE_STEPS * constants.CONTROL_TIMESTEP, random_state=seed)


register_task(DOMAIN, ExtraTask(DOMAIN, partial(load, None), camera_id=FRONT_CAMERA_ID,
                                description="reach the brick, placed anywhere on the table"))
for _name, _position in BRICK_POSITIONS.items():
    _corner = _name.removeprefix(f"{DOMAIN}_").replace("_", "-")
    register_task(_name, ExtraTask(DOMAIN, partial(load, _position), camera_id=FRONT_CAMERA_ID,
                                   description=f"reach the brick at the table's {_corner} corner (appendix F)"))
