"""URLB's quadruped tasks beyond the suite's: stand and jump (github.com/rll-research/url_benchmark).

The suite's quadruped model (URLB's custom_dmc_tasks/quadruped.xml is the suite's quadruped.xml unchanged), on the
walk task's floor (20 m wide), with the suite's observations (egocentric joint state, torso velocity, torso
upright, IMU, toe force/torque: 78 numbers), initial states (a uniformly random orientation, placed at the lowest
height free of contacts) and episodes (1000 control steps of 0.02 s, time limit 20 s). So the tasks are in domain
`quadruped` and share pre-training snapshots with `quadruped_walk` etc. Rewards, with the suite's upright term:

    upright = tolerance(torso_zz, bounds=(1, inf), margin=2, value_at_margin=0, sigmoid='linear')
            = (1 + torso_zz) / 2       torso_zz: world-z component of the torso's z axis (1 upright, -1 upside down)

- `quadruped_stand`:  reward = upright
- `quadruped_jump`:   reward = upright * tolerance(h, bounds=(1, inf), margin=1, value_at_margin=0.5, sigmoid='linear')
                             = upright * min(1, (1 + h) / 2)          (h > -1)
  h: height (world z, m) of the whole quadruped's centre of mass, the model's `center_of_mass` sensor (the torso's
  subtree centre of mass); 1 m is URLB's jump height.

URLB's walk and run are the suite's `quadruped_walk` and `quadruped_run` (URLB's dmc.py loads any task the suite
has with `suite.load`; its own Move task is the suite's, unchanged), so they are not repeated here:

    reward = upright * tolerance(v_x, bounds=(s, inf), margin=s, value_at_margin=0.5, sigmoid='linear')
           = upright * clip((1 + v_x / s) / 2, 0, 1),       s = 0.5 m/s (walk), 5 m/s (run)

  v_x: forward velocity of the torso in its own frame (the `velocimeter` sensor). The run task's floor is 200 m
  wide, the others' 20 m; nothing else about the model differs.
"""

from __future__ import annotations

from functools import cache, partial

from protorl.envs.dmc import ExtraTask, _suite, register_task

DOMAIN = "quadruped"

JUMP_HEIGHT = 1.0  # m: centre-of-mass height above which the jump term is 1 (URLB)
TASKS: dict[str, str] = {  # task name -> motion
    "quadruped_stand": "stand",
    "quadruped_jump": "jump",
}
DESCRIPTIONS = {
    "stand": "stand upright, from a random orientation (URLB)",
    "jump": "stand upright with the centre of mass 1 m high (URLB)",
}


@cache
def _task_class() -> type:
    """The dm_control task class, built on first use so that importing this module skips dm_control."""
    from dm_control.suite import quadruped
    from dm_control.utils import rewards

    class UprightQuadruped(quadruped.Move):
        """The suite's quadruped (its initial states and observations: those of `Move`) rewarded for standing
        upright, or for standing upright with its centre of mass high."""

        def __init__(self, motion: str, random: int):
            self.motion = motion
            super().__init__(desired_speed=0.0, random=random)  # the speed is unused: get_reward is replaced

        def get_reward(self, physics) -> float:
            upright = quadruped._upright_reward(physics)
            if self.motion == "stand":
                return upright
            height = physics.named.data.sensordata["center_of_mass"][2]
            jump = rewards.tolerance(height, bounds=(JUMP_HEIGHT, float("inf")), margin=JUMP_HEIGHT,
                                     value_at_margin=0.5, sigmoid="linear")
            return upright * jump

    return UprightQuadruped


def load(motion: str, seed: int):
    """A dm_control `control.Environment`: the suite's quadruped, on the walk task's floor, with a stand or jump
    reward."""
    _suite()  # chooses the rendering backend before dm_control is imported
    from dm_control.rl import control
    from dm_control.suite import common, quadruped

    xml = quadruped.make_model(floor_size=quadruped._DEFAULT_TIME_LIMIT * quadruped._WALK_SPEED)
    physics = quadruped.Physics.from_xml_string(xml, common.ASSETS)
    return control.Environment(physics, _task_class()(motion, random=seed), time_limit=quadruped._DEFAULT_TIME_LIMIT,
                               control_timestep=quadruped._CONTROL_TIMESTEP)


for _name, _motion in TASKS.items():
    register_task(_name, ExtraTask(DOMAIN, partial(load, _motion), description=DESCRIPTIONS[_motion]))
