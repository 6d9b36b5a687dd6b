"""protorl's tasks as Gymnasium environments (the `gym` extra: `pip install -e ".[gym]"`): `import protorl.gym`
registers `protorl/<task>-v0`. The other way, any Gymnasium environment as a protorl task (`task=gym:<id>`), is
`protorl.envs.gymnasium_env`."""

import importlib.util

if importlib.util.find_spec("gymnasium") is not None:  # without it, task=gym:<id> says which extra to install
    from protorl.gym.export import ProtorlEnv, register_all

    __all__ = ["ProtorlEnv", "register_all"]
