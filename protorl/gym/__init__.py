"""Gymnasium both ways (the `gym` extra: `pip install -e ".[gym]"`): protorl's tasks as Gymnasium environments
(`export`: `import protorl.gym` registers `protorl/<task>-v0`), and any Gymnasium environment as a protorl task
(`wrap`: `env=gym:<id>`)."""

import importlib.util

if importlib.util.find_spec("gymnasium") is not None:  # without it, `wrap` says which extra to install
    from protorl.gym.export import ProtorlEnv, register_all

    __all__ = ["ProtorlEnv", "register_all"]
