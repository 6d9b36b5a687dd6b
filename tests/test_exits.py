"""How a command ends: one function decides the exit status and the line of every error, and importing the command
line's module changes nothing."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool

import pytest
from omegaconf.errors import ValidationError

from protorl.app.exits import DIVERGED_STATUS, SWEEP_JOB_STOPPED_STATUS, USER_ERROR_STATUS, exit_status, file_of
from protorl.errors import CheckpointError, ConfigError, TrainingDiverged
from tests.runs import environment


@pytest.mark.parametrize(("error", "status", "line"), [
    (ConfigError("invalid config value seed=-1"), USER_ERROR_STATUS, "invalid config value seed=-1"),
    (CheckpointError("checkpoint x is damaged"), USER_ERROR_STATUS, "checkpoint x is damaged"),
    (TrainingDiverged("pretrain stopped at frame 8"), DIVERGED_STATUS, "pretrain stopped at frame 8"),
    (PermissionError(13, "Permission denied", "/runs/x/config.yaml"), USER_ERROR_STATUS,
     "I/O error on /runs/x/config.yaml: Permission denied"),
    (ValidationError("Value 'x' could not be converted to Integer\n    full_key: seed"), USER_ERROR_STATUS,
     "Value 'x' could not be converted to Integer"),
    (OSError(30, "Read-only file system", b"/runs/x/tb/events.out.tfevents.1"), USER_ERROR_STATUS,
     "I/O error on /runs/x/tb/events.out.tfevents.1: Read-only file system"),  # a path TensorBoard gave as bytes
    (BrokenProcessPool("A worker process was terminated.\nThe exit codes of the workers are {SIGKILL(-9)}"),
     SWEEP_JOB_STOPPED_STATUS, "a process running the sweep's jobs ended abruptly (The exit codes of the workers "
     "are {SIGKILL(-9)}): killed, or short of memory; rerun the same command to resume the sweep: completed jobs "
     "are skipped, the others resume from their checkpoints"),
])
def test_each_error_a_user_can_fix_ends_with_its_status_and_one_line(error, status, line):
    assert exit_status(error) == (status, line)


def test_a_bug_is_not_a_users_error_and_keeps_its_traceback():
    assert exit_status(ZeroDivisionError("division by zero")) is None
    assert exit_status(KeyError("agent")) is None


IMPORT_ONLY = """
import logging
from hydra.core.config_store import ConfigStore
import protorl.app.cli
print(sorted(ConfigStore.instance().repo), logging.getLogger("absl").level, logging.getLogger("OpenGL").level)
protorl.app.cli.register_configs()
print("protorl_schema.yaml" in ConfigStore.instance().repo)
"""


def test_importing_the_command_line_module_registers_nothing_and_sets_no_logging():
    result = subprocess.run([sys.executable, "-c", IMPORT_ONLY], capture_output=True, text=True, timeout=300,
                            env=environment())
    assert result.returncode == 0, result.stderr[-2000:]
    before, after = result.stdout.splitlines()[-2:]
    assert "protorl_schema" not in before and "agent_schema" not in before and before.endswith("0 0"), before
    assert after == "True"


def test_a_config_group_without_the_option_asked_for_is_named_with_its_options():
    from hydra.errors import MissingConfigException

    error = MissingConfigException("Could not find 'preset/smal'", "preset/smal", ["demo", "paper", "small"])
    assert exit_status(error) == (USER_ERROR_STATUS, "preset=smal: no such preset (did you mean small?); the "
                                                     "presets are demo, paper, small")


def test_an_os_error_without_a_file_names_the_file_open_where_it_was_raised(tmp_path):
    """A write that fails when its file is closed (Hydra's and TensorBoard's, on a full disk) names no file: the
    line names the file open in the innermost frame that holds one."""
    def save(path):
        with open(path, "w") as file:  # noqa: F841 - the frame's open file is what names the error
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as raised:
        save(tmp_path / "multirun.yaml")
    assert file_of(raised.value) == str(tmp_path / "multirun.yaml")
    assert exit_status(raised.value) == (USER_ERROR_STATUS,
                                         f"I/O error on {tmp_path / 'multirun.yaml'}: No space left on device")


def test_output_closed_by_its_reader_ends_the_command_quietly(tmp_path):
    """`protorl-train --help | head -1`: the reader stops before the command writes; no error line, no traceback."""
    from tests.runs import command_line

    process = subprocess.Popen(command_line("train", "--help", run_dir=tmp_path / "run"), env=environment(),
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before the command has started writing (its imports take a second)
    stderr = process.communicate(timeout=120)[1].decode()
    assert process.returncode == 1, stderr
    assert stderr == "", stderr
