"""What each task is, in a few words: the domains and tasks `protorl-tasks` lists. The paper's own tasks describe
themselves where they are registered (`ExtraTask.description`); the suite's are described here."""

from __future__ import annotations

from itertools import groupby

DOMAINS = {  # domain -> what it is
    "acrobot": "a two-link pendulum actuated at the elbow",
    "ball_in_cup": "a planar cup with a ball on a string",
    "cartpole": "a cart on a rail with a pole hinged to it",
    "cheetah": "a planar running biped",
    "dog": "a 3-d dog model with many joints",
    "finger": "a planar two-link finger and a hinged body it turns",
    "fish": "a fish swimming in 3-d",
    "hopper": "a planar one-legged hopper",
    "humanoid": "a 3-d humanoid",
    "humanoid_CMU": "the humanoid of the CMU motion-capture data",
    "lqr": "a chain of masses and springs with a quadratic cost",
    "manipulator": "a planar arm with a gripper",
    "pendulum": "a single pendulum",
    "point_mass": "a point mass in a square arena",
    "point_mass_maze": "the paper's U-maze (appendix E): the point-mass arena with three walls",
    "quadruped": "a 3-d four-legged robot",
    "reach_duplo": "the paper's Jaco arm reaching a Duplo brick (appendix F)",
    "reacher": "a planar two-link arm",
    "stacker": "a planar arm with a gripper, and boxes",
    "swimmer": "a planar snake-like swimmer",
    "walker": "a planar biped",
}

SUITE_TASKS = {  # the DeepMind Control Suite's tasks -> what earns the reward
    "acrobot_swingup": "swing the tip up and keep it there",
    "acrobot_swingup_sparse": "the same, rewarded only with the tip at the top",
    "ball_in_cup_catch": "swing the ball into the cup (sparse)",
    "cartpole_balance": "keep the pole upright, starting upright",
    "cartpole_balance_sparse": "the same, rewarded only while upright and centred",
    "cartpole_swingup": "swing the pole up from hanging and balance it",
    "cartpole_swingup_sparse": "the same, rewarded only while upright and centred",
    "cartpole_two_poles": "swing up and balance two poles in a chain",
    "cartpole_three_poles": "swing up and balance three poles in a chain",
    "cheetah_run": "run forward fast",
    "dog_fetch": "fetch a ball",
    "dog_run": "run",
    "dog_stand": "stand up",
    "dog_trot": "trot",
    "dog_walk": "walk",
    "finger_spin": "spin the body",
    "finger_turn_easy": "turn the body's tip to a target (a large one)",
    "finger_turn_hard": "the same, to a small target",
    "fish_swim": "swim to a target",
    "fish_upright": "keep upright",
    "hopper_hop": "hop forward",
    "hopper_stand": "stand upright",
    "humanoid_stand": "stand up",
    "humanoid_walk": "walk",
    "humanoid_run": "run",
    "humanoid_run_pure_state": "run, observing the raw physical state",
    "humanoid_CMU_stand": "stand up",
    "humanoid_CMU_walk": "walk",
    "humanoid_CMU_run": "run",
    "lqr_lqr_2_1": "drive 2 masses to rest with 1 actuator",
    "lqr_lqr_6_2": "drive 6 masses to rest with 2 actuators",
    "manipulator_bring_ball": "bring a ball to a target",
    "manipulator_bring_peg": "bring a peg to a target",
    "manipulator_insert_ball": "put a ball into a basket",
    "manipulator_insert_peg": "insert a peg into a slot",
    "pendulum_swingup": "swing up and balance (sparse)",
    "point_mass_easy": "reach the target at the centre",
    "point_mass_hard": "the same, each actuator pushing in a random direction",
    "quadruped_walk": "walk",
    "quadruped_run": "run",
    "quadruped_escape": "escape from a bowl-shaped valley",
    "quadruped_fetch": "fetch a ball and bring it to a target",
    "reacher_easy": "touch a target (a large one)",
    "reacher_hard": "the same, a small target",
    "stacker_stack_2": "stack 2 boxes",
    "stacker_stack_4": "stack 4 boxes",
    "swimmer_swimmer6": "swim to a target with 6 links",
    "swimmer_swimmer15": "swim to a target with 15 links",
    "walker_stand": "stand upright",
    "walker_walk": "walk forward",
    "walker_run": "run forward fast",
}


def task_description(name: str) -> str:
    """What earns `name`'s reward, in a few words ("" for a task nobody described)."""
    from protorl.envs.dmc import EXTRA_TASKS

    extra = EXTRA_TASKS.get(name)
    return extra.description if extra is not None else SUITE_TASKS.get(name, "")


def catalog() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Every task by domain: (domain, what it is, [(task, what earns its reward), ...]), in name order."""
    from protorl.envs.dmc import list_tasks
    from protorl.envs.factory import split_task

    by_domain = groupby(sorted(list_tasks(), key=lambda task: (split_task(task)[0], task)),
                        key=lambda task: split_task(task)[0])
    return [(domain, DOMAINS.get(domain, ""), [(task, task_description(task)) for task in tasks])
            for domain, tasks in by_domain]
