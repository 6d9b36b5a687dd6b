"""protorl: Proto-RL (Yarats, Fergus, Lazaric, Pinto, ICML 2021) in PyTorch."""

__version__ = "0.1.0"


def load_pretrained(path, device="auto"):
    """A pre-training snapshot as a frozen encoder (+ projector and prototypes) and exploration actor
    (`protorl.pretrained.load_pretrained`)."""
    from protorl.pretrained import load_pretrained as load

    return load(path, device)
