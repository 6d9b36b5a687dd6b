"""The paper's multitask Walker tasks (appendix F): run and flip, forward and backward.

The suite's walker model, observations, initial states and episodes (1000 control steps of 0.025 s),
so the tasks are in domain `walker` and share pre-training snapshots with `walker_walk` etc. Rewards
follow the suite's walker run (dm_control/suite/walker.py), with the direction handling of
Plan2Explore's cheetah variants (github.com/ramanans1/dm_control) and URLB's walker flip:

    standing    = tolerance(torso_height, bounds=(1.2, inf), margin=0.6)            (gaussian sigmoid)
    upright     = (1 + torso_zz) / 2           torso_zz: world-z component of the torso's z axis
    stand       = (3 * standing + upright) / 4
    reward      = stand * (5 * move + 1) / 6,  d = +1 for forward, -1 for backward

- `walker_run_forward` / `walker_run_backward`:
      move = tolerance(d * v_x, bounds=(8, inf), margin=4, value_at_margin=0.5, sigmoid='linear')
  v_x: horizontal velocity of the walker's centre of mass (m/s, the suite's `torso_subtreelinvel`
  sensor); 8 m/s is the suite's run speed. `walker_run_forward` equals the suite's `walker_run`.
- `walker_flip_forward` / `walker_flip_backward`:
      move = tolerance(d * L_y, bounds=(5, inf), margin=5, value_at_margin=0, sigmoid='linear')
  L_y: angular momentum of the whole walker (the torso's subtree) about its centre of mass around the
  world y axis, `subtree_angmom['torso'][1]` (kg m^2/s), as in Plan2Explore's cheetah flip and URLB's
  walker flip, with their spin constant 5. Positive L_y pitches the torso's top towards +x, the way the
  walker faces, i.e. a forward (front) flip. With legs straight the walker's moment of inertia about its
  centre of mass is ~7.2 kg m^2, so L_y = 5 is ~0.7 rad/s stretched out and faster when tucked.
"""

from __future__ import annotations

from functools import cache, partial

from protorl.envs.dmc import ExtraTask, _suite, register_task

DOMAIN = "walker"

RUN_SPEED = 8.0  # m/s: centre-of-mass speed above which the move term is 1 (the suite's walker run)
SPIN_MOMENTUM = 5.0  # kg m^2/s: angular momentum about y above which the flip term is 1 (Plan2Explore, URLB)
TASKS: dict[str, tuple[str, int]] = {  # task name -> (motion, direction: +1 forward, -1 backward)
    "walker_run_forward": ("run", 1),
    "walker_run_backward": ("run", -1),
    "walker_flip_forward": ("flip", 1),
    "walker_flip_backward": ("flip", -1),
}


@cache
def _task_class() -> type:
    """The dm_control task class, built on first use so that importing this module skips dm_control."""
    from dm_control.suite import walker
    from dm_control.utils import rewards

    class DirectionalWalker(walker.PlanarWalker):
        """The suite's planar walker rewarded for running or flipping in one direction."""

        def __init__(self, motion: str, direction: int, random: int):
            self.motion, self.direction = motion, direction
            super().__init__(move_speed=RUN_SPEED, random=random)

        def get_reward(self, physics) -> float:
            standing = rewards.tolerance(physics.torso_height(), bounds=(walker._STAND_HEIGHT, float("inf")),
                                         margin=walker._STAND_HEIGHT / 2)
            upright = (1 + physics.torso_upright()) / 2
            stand_reward = (3 * standing + upright) / 4
            if self.motion == "flip":
                move_reward = rewards.tolerance(self.direction * physics.named.data.subtree_angmom["torso"][1],
                                                bounds=(SPIN_MOMENTUM, float("inf")), margin=SPIN_MOMENTUM,
                                                value_at_margin=0, sigmoid="linear")
            else:
                move_reward = rewards.tolerance(self.direction * physics.horizontal_velocity(),
                                                bounds=(RUN_SPEED, float("inf")), margin=RUN_SPEED / 2,
                                                value_at_margin=0.5, sigmoid="linear")
            return stand_reward * (5 * move_reward + 1) / 6

    return DirectionalWalker


def load(motion: str, direction: int, seed: int):
    """A dm_control `control.Environment`: the suite's walker with a run or flip reward."""
    _suite()  # chooses the rendering backend before dm_control is imported
    from dm_control.rl import control
    from dm_control.suite import walker

    physics = walker.Physics.from_xml_string(*walker.get_model_and_assets())
    return control.Environment(physics, _task_class()(motion, direction, random=seed),
                               time_limit=walker._DEFAULT_TIME_LIMIT, control_timestep=walker._CONTROL_TIMESTEP)


for _name, (_motion, _direction) in TASKS.items():
    _way = "forward" if _direction > 0 else "backward"
    _what = {"run": f"run {_way} fast", "flip": f"flip {_way}, spinning the body"}[_motion]
    register_task(_name, ExtraTask(DOMAIN, partial(load, _motion, _direction),
                                   description=f"{_what} (appendix F; the same as walker_run)"
                                   if _name == "walker_run_forward" else f"{_what} (appendix F)"))
