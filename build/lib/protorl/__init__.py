"""protorl: Proto-RL (Yarats, Fergus, Lazaric, Pinto, ICML 2021) in PyTorch.

From Python: `protorl.pretrain`, `protorl.finetune`, `protorl.train` (`protorl.app.commands`) run what the commands
run; `protorl.load_pretrained` (`protorl.pretrained`) reads a snapshot into a frozen encoder and actor, and
`protorl.probe_snapshot` (`protorl.reports.probe`) measures what its encoder knows of the physical state
(`protorl.probe_snapshots` for several snapshots, sharing their frames).
"""

import importlib
from importlib.metadata import version

__version__ = version("protorl")  # one place: pyproject.toml, as installed

_API = {"pretrain": "protorl.app.commands", "finetune": "protorl.app.commands", "train": "protorl.app.commands",
        "load_pretrained": "protorl.pretrained",
        "probe_snapshot": "protorl.reports.probe",
        "probe_snapshots": "protorl.reports.probe"}  # imported on first use: `import protorl` stays light


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'protorl' has no attribute {name!r}")


__all__ = [*_API, "__version__"]
