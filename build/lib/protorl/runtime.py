"""Device choice, seeding, allocator tuning and the process-wide settings of a run."""

from __future__ import annotations

import ctypes
import random
import re
import sys

import numpy as np
import torch

from protorl.config import RuntimeConfig
from protorl.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """'auto' -> CUDA when available, else CPU; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_problem(name: str) -> str | None:
    """What a device name should be instead, where this machine cannot run on `name`; None where it can."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", name):
        return "'auto', 'cpu' or 'cuda[:N]'"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            return "'auto' or 'cpu': CUDA is not available on this machine"
        index = name.partition(":")[2]
        if index and int(index) >= torch.cuda.device_count():
            return f"'cuda:N' with N below {torch.cuda.device_count()}, the CUDA devices of this machine"
    return None


def check_device(name: str) -> torch.device:
    """`resolve_device(name)`, or `ConfigError` for a device this machine does not have."""
    problem = device_problem(name)
    if problem is not None:
        raise ConfigError(f"invalid device {name!r}: expected {problem}")
    return resolve_device(name)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameter numbers from glibc's <malloc.h>


def tune_malloc() -> bool:
    """Keep large tensors on glibc's heap instead of fresh mmap'd pages.

    By default glibc serves every allocation above 128 KB-32 MB with its own mmap and unmaps it on
    free, so each batch's activations page-fault in anew; that alone made the pre-training update
    ~2.4x slower here. This is the in-process equivalent of `MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=<large>`. Returns False where glibc is not the allocator.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok_mmap = libc.mallopt(_M_MMAP_MAX, 0)
        ok_trim = libc.mallopt(_M_TRIM_THRESHOLD, 2**30)
    except (OSError, AttributeError):
        return False
    return bool(ok_mmap and ok_trim)


def prepare_process(cfg: RuntimeConfig) -> torch.device:
    """Process-wide settings for a run: threads, allocator tuning, cuDNN's algorithm search, TF32; returns the device.

    On CUDA, `runtime.cudnn_benchmark` lets cuDNN time its convolution algorithms once per input shape and keep the
    fastest: every update has the same shapes. The algorithm it picks may differ between runs. `runtime.tf32` (a
    departure: float32 matrix products computed with TensorFloat-32's 10-bit mantissa) applies on CUDA only."""
    if cfg.fast_malloc:
        tune_malloc()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
    return device
