"""Environments: DeepMind Control tasks named `domain_task` and Gymnasium environments (`gym:<id>`), as pixels
or states."""

# Importing these registers the paper's own tasks (appendices E and F) and URLB's quadruped tasks; none imports
# dm_control yet.
from protorl.envs import point_mass_maze, quadruped_tasks, reach_duplo, walker_tasks  # noqa: F401
from protorl.envs.dmc import EXTRA_TASKS, DMCEnv, ExtraTask, list_tasks, register_task
from protorl.envs.env import Env, Simulated
from protorl.envs.factory import check_task, make_env, split_task
from protorl.envs.time_step import TimeStep

__all__ = ["EXTRA_TASKS", "DMCEnv", "Env", "ExtraTask", "Simulated", "TimeStep", "check_task", "list_tasks", "make_env",
           "register_task", "split_task"]
