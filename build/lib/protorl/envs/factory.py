"""Every environment by its task name: a DeepMind Control task (`domain_task`, the paper's extra tasks included) or
a Gymnasium environment (`gym:<id>`, with the `gym` extra)."""

from __future__ import annotations

from protorl.config import EnvConfig
from protorl.envs.dmc import DMCEnv, dmc_task
from protorl.envs.env import Env
from protorl.envs.names import GYMNASIUM_PREFIX


def check_task(name: str) -> None:
    """Raise `ValueError` listing the valid task names if `name` is not one (or not a registered `gym:<id>`)."""
    split_task(name)


def split_task(name: str) -> tuple[str, str]:
    """`'point_mass_easy'` -> `('point_mass', 'easy')`; a Gymnasium task is a domain of its own."""
    if name.startswith(GYMNASIUM_PREFIX):
        from protorl.envs.gymnasium_env import check_gymnasium_task  # Gymnasium is an optional extra
        check_gymnasium_task(name)
        return name, name
    return dmc_task(name)


def make_env(task: str, cfg: EnvConfig, seed: int) -> Env:
    """Build a `DMCEnv` (or for `gym:<id>`, a `GymnasiumEnv`) observed and stepped as `cfg` says."""
    if task.startswith(GYMNASIUM_PREFIX):
        from protorl.envs.gymnasium_env import GymnasiumEnv  # Gymnasium is an optional extra
        return GymnasiumEnv(task, obs=cfg.obs, image_size=cfg.image_size, frame_stack=cfg.frame_stack,
                            action_repeat=cfg.action_repeat, seed=seed)
    return DMCEnv(task, obs=cfg.obs, image_size=cfg.image_size, frame_stack=cfg.frame_stack,
                  action_repeat=cfg.action_repeat, camera_id=cfg.camera_id, seed=seed)
