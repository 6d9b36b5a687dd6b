"""A run directory is a contract: its `config.yaml` describes exactly the data in it.

`claim_run_dir` enforces it before a run writes anything of its own (`check_run_dir` asks the same questions and
changes nothing):
- one run at a time writes to a directory: an exclusive lock (`.lock`, holding the writer's pid) that the
  operating system releases when the process ends, so a killed run's lock is stale and taken over;
- a directory that holds data is continued only with the settings it was made with (`RERUN_FREE_KEYS` may
  differ: they change how a run is watched or where it runs, not what it computes);
- `resume=false` over existing data is refused unless `start_over=true`, which deletes the data that the run
  recorded in `config.yaml` wrote (nothing else) first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import OmegaConf

from protorl.agents import agent_class
from protorl.config import Config, rerun_free_keys
from protorl.errors import ConfigError, ProtorlError, first_line
from protorl.storage.checkpoints import list_checkpoints, load_checkpoint
from protorl.storage.digests import unsealed_record
from protorl.storage.run_files import (
    CONFIG_FILE,
    DOWNSTREAM_DIR,
    PRETRAIN_DIR,
    RESULT_FILE,
    SETTINGS_KEY,
    downstream_dir_name,
    phase_dirs,
    read_run_config,
    scratch_dir_name,
)

log = logging.getLogger("protorl")

LOCK_FILE = ".lock"
ELSEWHERE = "another run directory (hydra.run.dir=, or run_dir= in Python)"  # what a refusal advises choosing
# names of run data: a directory holding one of these is not taken for a new run (Hydra's .hydra/ and log are not)
RUN_DATA = (CONFIG_FILE, "curves.png", "analysis", PRETRAIN_DIR, "wandb_id.txt", "wandb")
RUN_DATA_PREFIXES = (DOWNSTREAM_DIR,)  # finetune/ and finetune_<task>/
RERUN_FREE_KEYS = rerun_free_keys()  # the keys that may differ between the commands that write one directory

SNAPSHOT_PLACES = frozenset({"snapshot", "pretrain_sweep"})  # where a snapshot lives, once its content is recorded

_held: dict[Path, int] = {}  # run directory -> file descriptor of its lock, for the directories this process holds


class RunDirError(ConfigError):
    """The run directory cannot take this run; the message says why and what to do."""


def claim_run_dir(config: Config) -> Path:
    """Lock `config.run_dir` for this call and check the contract; returns the directory.

    One claim at a time per directory, from any process or thread: a second claim is refused as busy until
    `release_run_dir`. A refused claim holds nothing and leaves nothing of its own: a directory it created is
    removed if still empty, and a busy directory is never touched.
    """
    run_dir = Path(config.run_dir).resolve()
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()
            created = True
        except FileExistsError:
            created = False
        fd = _lock(run_dir)
    except OSError as error:
        raise RunDirError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
    try:
        _check_contract(run_dir, config)
    except BaseException as error:
        _unlock(fd)
        if created:  # only our lock file is in it
            with contextlib.suppress(OSError):
                (run_dir / LOCK_FILE).unlink()
                run_dir.rmdir()
        if isinstance(error, OSError):
            raise RunDirError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
        raise
    _held[run_dir] = fd
    return run_dir


def check_run_dir(config: Config) -> None:
    """Raise `RunDirError` if `claim_run_dir(config)` would be refused now; leaves nothing behind and locks nothing."""
    run_dir = Path(config.run_dir).resolve()
    try:
        existing = next(path for path in (run_dir, *run_dir.parents) if path.is_dir())  # where it will be created
        with tempfile.TemporaryFile(dir=existing):
            pass
        _check_not_busy(run_dir)
    except OSError as error:  # e.g. a name longer than the file system allows, a read-only disk
        raise RunDirError(f"cannot write to run directory {run_dir}: {error.strerror or error}") from None
    _check_contract(run_dir, config, delete=False)


def _check_not_busy(run_dir: Path) -> None:
    """`RunDirError` if another process holds the lock of `run_dir`."""
    lock = run_dir / LOCK_FILE
    if not lock.is_file():
        return
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        raise RunDirError(f"run directory {run_dir} is in use by process {holder} (its lock {lock}); wait for "
                          f"it to end, or choose {ELSEWHERE}") from None
    except OSError:
        pass  # a file system without locks: claim_run_dir warns
    finally:
        os.close(fd)


def release_run_dir(run_dir: Path) -> None:
    """Release this process's lock on `run_dir` (the end of a sweep job; a process's exit also releases it)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        _unlock(fd)


def holds_data(run_dir: Path) -> bool:
    """Whether protorl has written run data into `run_dir`."""
    return any(_data_paths(run_dir))


def saved_config(run_dir: Path) -> Config:
    """The config a run directory was made with (its config.yaml, on today's schema)."""
    path = run_dir / CONFIG_FILE
    try:
        saved = read_run_config(path)
        agent_schema = OmegaConf.structured(agent_class(str(saved.agent.name)).config_class)  # the agent's own keys
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), {"agent": agent_schema}, saved))
    except Exception as error:  # unreadable, not YAML (e.g. cut short), or not this schema
        raise RunDirError(f"{path}: cannot be read as a protorl config ({first_line(error)})") from None


def config_differences(saved: Config, wanted: Config) -> list[str]:
    """`key=saved (now: wanted)` for every result-changing key whose values differ, dotted, sorted. A snapshot
    recorded by its content (`snapshot_sha256`) may have moved: then where it lives is free, its content is not."""
    return settings_differences(run_settings(saved), run_settings(wanted))


def run_settings(config: Config) -> dict[str, object]:
    """Every setting of a run, dotted (`agent.lr`), as plain values: what its checkpoints record of it."""
    return _flatten(OmegaConf.to_container(OmegaConf.structured(config)))


def settings_differences(saved: dict[str, object], wanted: dict[str, object]) -> list[str]:
    """`key=saved (now: wanted)` for every result-changing setting in which two `run_settings` differ, sorted."""
    return [f"{key}={saved.get(key)!r} (now {wanted.get(key)!r})"
            for key in result_changing_differences(saved, wanted)]


def result_changing_differences(old: dict[str, object], new: dict[str, object], symmetric: bool = False
                                ) -> list[str]:
    """The dotted keys, sorted, whose values differ between two flattened configs in a way that changes results:
    not `RERUN_FREE_KEYS`, and not where a snapshot lives once `old` records it by its content (`symmetric`: once
    both do; two recorded runs compare alike in either order)."""
    recorded = [config.get("snapshot_sha256") is not None for config in ((old, new) if symmetric else (old,))]
    free = RERUN_FREE_KEYS | (SNAPSHOT_PLACES if all(recorded) else set())
    if not all(recorded):  # recorded by an older protorl: by its path
        free |= {"snapshot_sha256"}
    return [key for key in sorted(old.keys() | new.keys())
            if key not in free and old.get(key) != new.get(key)]


def _check_contract(run_dir: Path, config: Config, delete: bool = True) -> None:
    """Refuse what the contract refuses; with `start_over`, delete the earlier run's data (if `delete`)."""
    if not holds_data(run_dir):
        return
    has_config = (run_dir / CONFIG_FILE).is_file()
    if config.start_over:
        if not has_config:
            raise RunDirError(f"run directory {run_dir} holds run data but no {CONFIG_FILE}: start_over deletes only "
                              f"a run it can identify; remove the files yourself or choose {ELSEWHERE}")
        if not delete:
            return
        for path in _run_paths(run_dir, saved_config(run_dir)):
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                shutil.rmtree(path)
        log.info("start_over=true: deleted the earlier run's data in %s", run_dir)
        return
    if not config.resume:
        raise RunDirError(f"run directory {run_dir} already holds a run and resume=false: add start_over=true to "
                          f"delete its data and start again, or choose {ELSEWHERE}")
    if not has_config:
        raise RunDirError(f"run directory {run_dir} holds run data but no {CONFIG_FILE} to check it against: "
                          f"choose {ELSEWHERE}")
    saved = saved_config(run_dir)
    _check_config_file(run_dir, saved)
    differences = config_differences(saved, config)
    if differences:
        shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
        variant = any(d.startswith("agent.anti_collapse=") for d in differences) and saved.agent.name == "proto"
        hint = (" (agent=proto_variant: Proto-RL's working variant, agent=proto: as published, under every preset)"
                if variant else "")
        raise RunDirError(f"run directory {run_dir} holds a run with other settings: {shown}. Rerun it with its "
                          f"own settings ({run_dir / CONFIG_FILE}){hint}, choose {ELSEWHERE}, or add "
                          "start_over=true to delete its data")


def _check_config_file(run_dir: Path, saved: Config) -> None:
    """`RunDirError` quoting the recorded values if `config.yaml` no longer says what the run recorded when it wrote
    its data (an edited file): the settings of a run are not taken from an editable file alone. The records are its
    result records, checkpoints and snapshots, read until one agrees; a file that disagrees while another agrees
    is another run's, and the phase that reads it sets it aside."""
    wanted, first = run_settings(saved), None
    for settings, source in recorded_settings(run_dir):
        differences = result_changing_differences(settings, wanted)
        if not differences:
            return
        first = first or (settings, source, differences)
    if first is not None:
        settings, source, differences = first
        shown = "; ".join(f"{key}={settings.get(key)!r} (config.yaml: {wanted.get(key)!r})"
                          for key in differences[:4]) + (f"; and {len(differences) - 4} more"
                                                          if len(differences) > 4 else "")
        raise RunDirError(f"run directory {run_dir}: its {CONFIG_FILE} was changed after the run recorded its "
                          f"settings in {source}: {shown}. Put the recorded values back into {CONFIG_FILE}, or "
                          f"choose {ELSEWHERE}")


def recorded_settings(run_dir: Path) -> Iterator[tuple[dict[str, object], Path]]:
    """The settings the run recorded with its data, and the file each was read from, cheapest first: its result
    records, its checkpoints and its snapshots (newest first). Files that cannot be read are passed over."""
    phases = phase_dirs(run_dir)
    for phase in phases:
        with contextlib.suppress(OSError, ValueError):
            settings = unsealed_record((phase / RESULT_FILE).read_text()).get(SETTINGS_KEY)
            if isinstance(settings, dict):
                yield settings, phase / RESULT_FILE
    for phase in phases:
        for path in reversed(list_checkpoints(phase / "checkpoints")):
            with contextlib.suppress(ProtorlError, OSError):
                settings = load_checkpoint(path).get(SETTINGS_KEY)
                if isinstance(settings, dict):
                    yield settings, path
    for phase in phases:
        for path in sorted((phase / "snapshots").glob("snapshot_*.pt"), key=lambda p: p.stat().st_mtime,
                           reverse=True):
            with contextlib.suppress(Exception):  # any file: only compared, never trusted
                config = torch.load(path, weights_only=True, mmap=True).get("config")
                if isinstance(config, dict):
                    yield _flatten(config), path


def _run_paths(run_dir: Path, saved: Config) -> list[Path]:
    """What the run recorded in `saved` wrote into `run_dir`: what `start_over` deletes."""
    names = [PRETRAIN_DIR, "analysis", "curves.png", "wandb_id.txt", CONFIG_FILE]
    names += [downstream_dir_name(saved, task) for task in saved.downstream_tasks]
    if saved.compare_without_pretraining:
        names += [scratch_dir_name(task) for task in saved.downstream_tasks]
    if saved.logging.wandb:
        names.append("wandb")
    return [run_dir / name for name in names if (run_dir / name).exists() or (run_dir / name).is_symlink()]


def _lock(run_dir: Path) -> int:
    """An exclusive lock on `run_dir`'s lock file, holding this process's pid; returns its file descriptor."""
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirError(f"run directory {run_dir} is in use by process {holder} (its lock {path}); wait for it "
                          f"to end, or choose {ELSEWHERE}") from None
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        log.warning("cannot lock %s (%s): this file system has no locks, so a second run in the same "
                    "directory would not be detected", path, error.strerror)
    try:
        previous = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if previous and previous != str(os.getpid()):
            log.info("run directory %s: taking over the stale lock of process %s, which has ended", run_dir, previous)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)  # an empty lock file: nobody holds it
    os.close(fd)


def _data_paths(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        return []
    return sorted(path for path in run_dir.iterdir()
                  if path.name in RUN_DATA or (path.name.startswith(RUN_DATA_PREFIXES) and path.is_dir()))


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
