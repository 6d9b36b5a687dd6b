"""Faults from outside the run: a disk that fills, a directory that turns read-only, a sweep's process killed. Each
ends in one line naming the file or saying what to do, with no thread's traceback; and a short chaos soak (the
sweep killed and interrupted at random moments, rerun until it completes) loses nothing.

The fault-injection tier: real runs from states. A full or read-only disk is a tmpfs (root only; skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protorl.logs.logger import Logger
from tests.runs import STATES, assert_ok, assert_user_error, environment, run, start

pytestmark = pytest.mark.slow  # the fault-injection tier: real runs, faults injected

ROOT = Path(__file__).resolve().parents[1]


def fill(disk: Path) -> None:
    """Write to `disk` until it has no byte left."""
    with open(disk / "ballast", "wb", buffering=0) as file:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    file.write(b"\0" * size)
            except OSError:
                pass


def test_a_full_disk_under_tensorboard_and_the_csvs_names_the_file_without_a_thread_traceback(
        tmp_path, mount, capfd):
    """TensorBoard's writer thread fails a write on a full disk when the events file is flushed: the run's error
    names that file (the write names none), and the thread prints no traceback of its own."""
    disk = mount(tmp_path / "disk", "size=1m")
    logger = Logger(disk / "pretrain", metrics=[])
    logger.log_train({"frames": 1000, "episode_reward": 1.0})
    fill(disk)
    with pytest.raises(OSError) as raised:
        for frames in range(2000, 200_000, 1000):  # until a buffer meets the full disk
            logger.log_train({"frames": frames, "episode_reward": 1.0})
    assert raised.value.filename is not None and str(disk / "pretrain") in raised.value.filename, raised.value
    time.sleep(0.5)  # the writer thread's end
    assert "Traceback" not in capfd.readouterr().err
    with contextlib.suppress(OSError):  # TensorBoard's writer, stopped, raises its error again
        logger.close()  # the files closed: the disk can be unmounted


def test_a_read_only_tensorboard_directory_is_one_line_naming_it(tmp_path, mount):
    """A run killed after its first checkpoint resumes into a TensorBoard directory that turned read-only."""
    run_dir = tmp_path / "run"
    settings = [*STATES, "pretrain_frames=4000", "checkpoints.every_frames=1000"]
    process = start("pretrain", *settings, run_dir=run_dir)
    deadline = time.time() + 150
    while not list((run_dir / "pretrain" / "checkpoints").glob("checkpoint_*.pt")):
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    process.kill()
    process.wait()
    mount(run_dir / "pretrain" / "tb", "ro,size=1m")
    result = run("pretrain", *settings, run_dir=run_dir)
    line = assert_user_error(result, str(run_dir / "pretrain" / "tb"), "Read-only file system")
    assert "b'" not in line, line  # the path as text, not as a bytes literal


def test_a_full_disk_when_hydra_writes_a_sweeps_file_is_one_line_naming_it(tmp_path, mount):
    disk = mount(tmp_path / "disk", "size=1m")
    (disk / "sweep").mkdir()
    fill(disk)
    result = subprocess.run([sys.executable, "-c", "from protorl.app.cli import pretrain; pretrain()", "-m",
                             *STATES, "pretrain_frames=2000", "seed=0,1", f"hydra.sweep.dir={disk / 'sweep'}"],
                            capture_output=True, text=True, timeout=150, env=environment(), cwd=tmp_path)
    assert_user_error(result, str(disk / "sweep" / "multirun.yaml"), "No space left on device")


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_a_sweep_whose_job_process_is_killed_ends_in_one_line_and_resumes(tmp_path):
    """A process running a sweep's jobs (joblib's worker) killed, as the kernel kills one short of memory: one line,
    exit status 1, saying how to resume; the same command then completes the sweep."""
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-c", "from protorl.app.cli import pretrain; pretrain()", "-m", *STATES,
               "pretrain_frames=4000", "checkpoints.every_frames=1000", "seed=0,1", "hydra/launcher=joblib",
               "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
                               cwd=tmp_path, start_new_session=True)
    deadline = time.time() + 150
    while not list(sweep.glob("*/pretrain/checkpoints/checkpoint_*.pt")):
        assert process.poll() is None and time.time() < deadline, process.communicate()
        time.sleep(0.05)
    workers = [pid for pid in group_pids(process.pid)
               if pid != process.pid and b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    _, stderr = process.communicate(timeout=150)
    assert process.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("protorl: error:")]
    assert len(errors) == 1 and "ended abruptly" in errors[0] and "rerun the same command" in errors[0], stderr
    os.killpg(process.pid, signal.SIGKILL)  # a worker the launcher left running
    assert_ok(subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment(), cwd=tmp_path))
    assert len(list(sweep.glob("*/pretrain/result.json"))) == 2


def test_a_short_chaos_soak_loses_nothing(tmp_path):
    """tools/chaos_soak.py for one round of a 2-job sweep: faults at random moments until the sweep completes,
    then every log, result and snapshot tensor the same as the undisturbed sweep's."""
    spec = importlib.util.spec_from_file_location("chaos_soak", ROOT / "tools" / "chaos_soak.py")
    chaos_soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chaos_soak)
    lines = []
    totals = chaos_soak.soak(tmp_path, jobs=2, rounds=1, minutes=0, seed=0, disk_mib=64, echo=lines.append)
    faults = sum(n for key, n in totals.items() if key.startswith("fault "))
    assert faults >= 1 and totals["compared"] >= 20, lines
    assert totals["differences"] == 0 and totals["hangs"] == 0 and totals["tracebacks"] == 0, lines
