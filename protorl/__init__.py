"""protorl: Proto-RL (Yarats, Fergus, Lazaric, Pinto, ICML 2021) in PyTorch."""

__version__ = "0.1.0"


def load_pretrained(path, device="auto"):
    """A pre-training snapshot as a frozen encoder (+ projector and prototypes) and exploration actor
    (`protorl.pretrained.load_pretrained`)."""
    from protorl.pretrained import load_pretrained as load

    return load(path, device)


def pretrain(config=None, **fields):
    """protorl-pretrain from Python: `protorl.commands.pretrain`."""
    from protorl.commands import pretrain as run

    return run(config, **fields)


def finetune(config=None, **fields):
    """protorl-finetune from Python: `protorl.commands.finetune`."""
    from protorl.commands import finetune as run

    return run(config, **fields)


def train(config=None, **fields):
    """protorl-train from Python: `protorl.commands.train`."""
    from protorl.commands import train as run

    return run(config, **fields)
