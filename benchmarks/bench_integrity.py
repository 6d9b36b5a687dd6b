"""What checking a file's digest adds to reading it: a snapshot of the main job (states, with its replay) and a
checkpoint at the paper's pixel settings (a full replay buffer, by default its 100k transitions: about 2.1 GB).

For each file: the time to write it as protorl 0.2.0 did (`torch.save`, fsync), to hash it, and to write it with
its digest (`atomic_save`); then, with the file in the page cache (warm) and dropped from it (cold:
`posix_fadvise(DONTNEED)` on that file alone), the time of reading it as protorl 0.2.0 did
(`torch.load(path, weights_only=True)`), of the digest check alone, and of protorl's verified read now
(`safe_load`: the check, then `torch.load`; for the checkpoint, as `load_checkpoint` reads it, with its tensors
mapping the file, so the copy a resume makes comes after: the checkpoint's rows "read and copy out" include it).
Each timing is the best of `--rounds` (the pixel checkpoint is written once). The files are
synthetic but of the real sizes: the agents built at those settings and updated once (so that the checkpoint
holds Adam's moments), their replay buffers filled with random frames.

    python benchmarks/bench_integrity.py                              # a few minutes, about 5 GB of memory
    python benchmarks/bench_integrity.py --pixel-transitions 20000    # a smaller pixel replay
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from protorl.agents import make_agent
from protorl.app.cli import register_configs
from protorl.config import Config
from protorl.envs import make_env
from protorl.errors import CheckpointError
from protorl.replay import ReplayBuffer
from protorl.storage.atomic import atomic_save, safe_load
from protorl.storage.checkpoints import CHECKPOINT_VERSION
from protorl.storage.digests import COMMENT_SIZE, archive_digest, sha256_of
from protorl.storage.snapshots import FORMAT_VERSION


def config(preset: str) -> Config:
    """protorl-train's config with `preset` (the main job is `demo`), as the command composes it."""
    register_configs()  # the schema the commands' configs build on
    with initialize_config_module("protorl.conf", version_base="1.3"):
        composed = compose("train", overrides=[f"preset={preset}"])
    settings = OmegaConf.masked_copy(composed, [key for key in composed if key != "run_dir"])  # Hydra's own
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), settings, {"run_dir": "unused"}))


def filled_replay(cfg: Config, task: str, transitions: int, keeps_states: bool):
    """The env of `task` and a replay buffer of `cfg`'s capacity holding `transitions` transitions of random frames,
    in episodes of the task's length."""
    env = make_env(task, cfg.env, seed=0)
    replay = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, cfg.replay.capacity, env.frame_stack,
                          seed=0, physical_state_shape=env.physical_state_shape if keeps_states else None)
    rng = np.random.default_rng(0)
    pool = [(rng.random(env.frame_shape) * 255).astype(env.frame_dtype) for _ in range(64)]
    state = np.zeros(env.physical_state_shape, dtype=np.float64) if keeps_states else None
    episode_steps = 1000 // env.action_repeat
    action = np.zeros(env.action_shape, dtype=np.float32)
    for step in range(transitions):
        if step % episode_steps == 0:
            replay.add_first(pool[step % 64], state)
        replay.add(pool[(step + 1) % 64], action, 0.0, 1.0, state)
    return env, replay


def updated_agent(cfg: Config, env, replay: ReplayBuffer):
    """The agent of `cfg` for `env` after one pre-training update (at batch 8: Adam's moments do not depend on it)."""
    agent = make_agent(dataclasses.replace(cfg.agent, batch_size=8), env.obs_type, env.obs_shape, env.action_shape,
                       torch.device("cpu"), "pretrain")
    agent.update(replay.sample(8), 0)
    return agent


def best(rounds: int, work: Callable[[], object], cold: Path | None = None) -> float:
    """The fewest seconds `work()` took in `rounds` calls; before each, `cold` is dropped from the page cache."""
    times = []
    for _ in range(rounds):
        if cold is not None:
            fd = os.open(cold, os.O_RDONLY)
            os.fsync(fd)  # nothing pending: every page can go
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def save_without_digest(payload: dict, path: Path) -> None:
    """What protorl 0.2.0 wrote: `torch.save`, fsync'ed."""
    with open(path, "wb") as file:
        torch.save(payload, file)
        file.flush()
        os.fsync(file.fileno())


def copied_out(payload: object) -> None:
    """Copy every tensor of `payload` into fresh memory, as a resume's `load_state_dict` calls do."""
    if isinstance(payload, torch.Tensor):
        payload.clone()
    elif isinstance(payload, dict):
        for value in payload.values():
            copied_out(value)


def row(name: str, size: int, operation: str, before: float, digest: float, now: float) -> str:
    return (f"| {name} | {size / 2**20:.1f} MiB | {operation} | {before:.3f} | {digest:.3f} | {now:.3f} | "
            f"{digest / before:.2f} | {now / before:.2f} |")


def measure(name: str, payload: dict, path: Path, rounds: int, write_rounds: int, mmap: bool) -> list[str]:
    """The table rows of one file: writing it, then reading it (and, for a checkpoint, copying it out) with the
    file in the page cache and dropped from it, as protorl 0.2.0 did and as it does now (`mmap`: as
    `load_checkpoint` reads, its tensors mapping the file). Digest alone: hashing the file (write), checking
    it (read)."""
    plain_path = path.with_name("without_digest.pt")
    plain_write = best(write_rounds, lambda: save_without_digest(payload, plain_path))
    plain_path.unlink()
    write = best(write_rounds, lambda: atomic_save(payload, path))
    size = path.stat().st_size

    def hashed() -> None:
        with open(path, "rb") as file:
            sha256_of(file, size - COMMENT_SIZE)

    def checked() -> None:
        with open(path, "rb") as file:
            archive_digest(file, path, "file")

    def before(copy: bool) -> Callable[[], None]:
        return lambda: (copied_out if copy else id)(torch.load(path, weights_only=True))

    def now(copy: bool) -> Callable[[], None]:
        return lambda: (copied_out if copy else id)(safe_load(path, "file", CheckpointError, mmap)[0])

    rows = [row(name, size, "write", plain_write, best(rounds, hashed), write)]
    for copy in (False, True) if mmap else (False,):
        for cache, cold in (("warm", None), ("cold", path)):
            operation = f"read{' and copy out' if copy else ''}, {cache}"
            rows.append(row(name, size, operation, best(rounds, before(copy), cold), best(rounds, checked, cold),
                            best(rounds, now(copy), cold)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pixel-transitions", type=int, default=100_000,
                        help="transitions in the paper-size checkpoint's replay (the paper's buffer holds 100k)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temporary "
                        "directory on the disk of /tmp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        demo = config("demo")
        steps = demo.pretrain_frames // demo.env.action_repeat
        env, replay = filled_replay(demo, demo.pretrain_task, steps, keeps_states=True)
        snapshot = {"format_version": FORMAT_VERSION, "agent": updated_agent(demo, env, replay).snapshot_state(),
                    "env_spec": env.spec(), "config": OmegaConf.to_container(OmegaConf.structured(demo)),
                    "frames": demo.pretrain_frames, "replay": replay.state_dict()}
        rows += measure(f"main job's snapshot (states, replay of {steps} transitions)", snapshot,
                        Path(directory) / "snapshot.pt", args.rounds, args.rounds, mmap=False)
        del env, replay, snapshot
        paper = config("paper")
        env, replay = filled_replay(paper, paper.task, args.pixel_transitions, keeps_states=False)
        checkpoint = {"checkpoint_version": CHECKPOINT_VERSION, "agent": updated_agent(paper, env, replay).state_dict(),
                      "replay": replay.state_dict()}
        del replay
        rows += measure(f"paper-size pixel checkpoint (84x84, replay of {args.pixel_transitions} transitions)",
                        checkpoint, Path(directory) / "checkpoint.pt", args.rounds, 1, mmap=True)
    print("| file | size | operation | protorl 0.2.0 (s) | digest alone (s) | now (s) | digest / 0.2.0 | "
          "now / 0.2.0 |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
