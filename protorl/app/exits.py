"""How a command ends for its user, decided here for every error: one `protorl: error:` line and exit status 2 for
what the user can fix (a setting, a file, Hydra's own complaint about the command line, a GPU's memory), 3 for a
training that diverged, one line and 130 for Ctrl-C, one line and 1 for a sweep whose job's process was killed,
nothing and 1 when what reads the output closes it (`| head`); anything else is a bug and keeps its traceback."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import threading
import traceback
from concurrent.futures.process import BrokenProcessPool
from typing import NoReturn

import torch
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from protorl.config import RENAMED_AGENTS, RENAMED_EXPERIMENTS, renamed_message, unknown_key_message
from protorl.errors import ProtorlError, TrainingDiverged, did_you_mean

INTERRUPTED_STATUS = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
SWEEP_JOB_STOPPED_STATUS = 1
USER_ERROR_STATUS = 2
DIVERGED_STATUS = 3


def exit_status(error: BaseException) -> tuple[int, str] | None:
    """The exit status and the line that `error` ends a command with; None for an error that is not the user's to
    fix (a bug: it keeps its traceback)."""
    if isinstance(error, TrainingDiverged):
        return DIVERGED_STATUS, one_line(error)
    if isinstance(error, ProtorlError):
        return USER_ERROR_STATUS, one_line(error)
    if isinstance(error, OverrideParseException):
        return USER_ERROR_STATUS, _unparsable(error.override, error.message)
    if isinstance(error, MissingConfigException):  # e.g. agent=protoo: a config group has no such option
        return USER_ERROR_STATUS, _missing_option(error)
    if isinstance(error, HydraException | OmegaConfBaseException):
        return USER_ERROR_STATUS, hydra_message(error)
    if isinstance(error, torch.OutOfMemoryError):  # an accelerator's memory: the agent's share is not estimated
        return USER_ERROR_STATUS, (f"out of memory on the device ({one_line(error).split('. ')[0]}): lower "
                                   "agent.batch_size or the agent's sizes (its networks, prototypes, queue), or "
                                   "set replay.on_device=false")
    if isinstance(error, OSError):  # after Hydra's: its missing config is one too
        return USER_ERROR_STATUS, f"I/O error on {file_of(error) or 'a file of the run'}: {error.strerror or error}"
    if isinstance(error, BrokenProcessPool):  # a sweep's launcher lost a process running its jobs
        cause = next((line for line in str(error).splitlines() if "exit codes" in line), one_line(error))
        return SWEEP_JOB_STOPPED_STATUS, (f"a process running the sweep's jobs ended abruptly ({cause}): killed, or "
                                          "short of memory; rerun the same command to resume the sweep: completed "
                                          "jobs are skipped, the others resume from their checkpoints")
    return None


def file_of(error: OSError) -> str | None:
    """The file `error` is about: its own `filename`, else the name of a file open in the innermost frame of its
    traceback that holds one (a write that fails when a file is flushed or closed, as Hydra's and TensorBoard's
    do on a full disk, names no file)."""
    if error.filename:
        return os.fsdecode(error.filename)  # a path given as bytes (TensorBoard's) as text
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        names = [value.name for value in frame.f_locals.values()
                 if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str)]
        if names:
            return names[0]
    return None


def exit_for(error: BaseException) -> NoReturn:
    """End the command for `error` as `exit_status` says (Ctrl-C: `exit_interrupted`); re-raise a bug's error."""
    if isinstance(error, KeyboardInterrupt):
        exit_interrupted(error)
    if isinstance(error, BrokenPipeError):  # what reads the output stopped (`| head`): nothing to tell it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # and nothing left to flush at exit
        sys.exit(1)
    ending = exit_status(error)
    if ending is None:
        raise error
    status, line = ending
    exit_with(line, status)


def exit_interrupted(interrupt: KeyboardInterrupt) -> NoReturn:
    """One line saying where Ctrl-C stopped the run and how to resume it; exit status 130. A further Ctrl-C while
    the process exits changes nothing (Python's shutdown would otherwise let it kill the process by the signal)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    where = str(interrupt) or ("interrupted; rerun the same command to resume: completed phases are kept and a "
                               "phase resumes from its last checkpoint")
    print(f"protorl: {where}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_STATUS)


def exit_with(error: Exception | str, status: int = USER_ERROR_STATUS) -> NoReturn:
    """`protorl: error: <error>` on stderr, then exit with `status`."""
    print_error(error)
    sys.exit(status)


def print_error(error: Exception | str) -> None:
    """`protorl: error: <error>` on stderr: the line every error ends a command with (a sweep's job, the job)."""
    print(f"protorl: error: {error}", file=sys.stderr, flush=True)


def one_line(error: BaseException) -> str:
    """An error (Hydra's and OmegaConf's included) as one line: its message, then its cause's, without the
    config search path and the full-key details."""
    parts = []
    for part in (error, error.__cause__):
        text = str(part or "").split("Config search path")[0].split("full_key:")[0]
        text = " ".join(text.replace("\t", " ").split())
        if text and text not in parts:
            parts.append(text)
    return ": ".join(parts) or type(error).__name__


def hydra_message(error: Exception) -> str:
    """One line for an error of Hydra or OmegaConf: the key to write instead where it names a key the grouped
    config renamed (e.g. in an experiment file of one's own)."""
    key = re.search(r"(?:Key|override) '([\w.]+)'|override ([\w.]+)=([^\s:]+)", str(error))
    renamed = key and renamed_message(key[1] or key[2], key[3])
    if renamed:
        return renamed
    if key and key[1] and str(error).startswith("Could not override"):  # Hydra's hint, `+key=value`, is refused too
        return unknown_key_message([key[1]])
    return one_line(error)


def _missing_option(error: MissingConfigException) -> str:
    """A config group's unknown option (`group=name`) as one line: what replaced a renamed one, otherwise the
    options there are and the closest."""
    group, _, name = (error.missing_cfg_file or "").rpartition("/")
    if group == "agent" and name in RENAMED_AGENTS:
        return (f"agent={name} is now agent={RENAMED_AGENTS[name]} (Proto-RL as published, under every preset; "
                "agent=proto_variant: its working variant; CHANGELOG.md)")
    if group == "experiment" and name in RENAMED_EXPERIMENTS:
        paper = name.replace("_finetune_2m", "_paper_finetune_2m")
        return (f"experiment={name} is now experiment={RENAMED_EXPERIMENTS[name]} (protorl's departures); "
                f"experiment={paper} fine-tunes as the paper does, which measured better at 2M (CHANGELOG.md)")
    if not group or not error.options:
        return one_line(error)
    return (f"{group}={name}: no such {group}{did_you_mean(name, error.options)}; the {group}s are "
            f"{', '.join(error.options)}")


def _unparsable(override: str, message: str) -> str:
    """What to do about an override that Hydra's grammar cannot read: most often a value that needs quotes."""
    key, _, value = override.partition("=")
    quoted = f"\"{key}='{value}'\"" if value else "KEY='VALUE'"
    return (f"cannot read the override {override} ({message.split(':')[0]}): a value holding spaces, letters "
            f"outside ASCII or other special characters must be quoted, e.g. {quoted} in a shell")
