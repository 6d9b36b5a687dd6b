"""Runs survive a kill: SIGKILL a real training subprocess after a checkpoint, re-run it, and compare with an
uninterrupted run (parameters bitwise, logs row for row)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from pathlib import Path

import pytest
import torch

from protorl.errors import CheckpointError
from protorl.storage.checkpoints import CHECKPOINT_VERSION, list_checkpoints, load_checkpoint
from protorl.storage.snapshots import load_snapshot
from tests.runs import TINY, assert_ok, read_csv, read_rows, run, start, wait_for_rows

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

RUN = [*TINY, "task=point_mass_easy", "pretrain_frames=5000", "snapshots.at_frames=[]",
       "checkpoints.every_frames=2000", "checkpoints.keep=2", "checkpoints.keep_completed=true"]


def rows_without_timing(run_dir: Path) -> list[dict[str, str]]:
    return read_rows(run_dir / "pretrain" / "train.csv")


def final_agent(run_dir: Path) -> dict:
    return load_snapshot(run_dir / "pretrain" / "snapshots" / "snapshot_5000.pt")["agent"]


def assert_same_agent(resumed: dict, straight: dict) -> None:
    """Every network, target and the queue bitwise equal."""
    for part in ("encoder", "head", "encoder_target", "projector_target", "actor", "queue"):
        for name, tensor in straight[part].items():
            other = resumed[part][name]
            assert torch.equal(tensor, other) if isinstance(tensor, torch.Tensor) else tensor == other, (part, name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("resume") / "straight"
    assert_ok(run("pretrain", *RUN, run_dir=run_dir))
    return run_dir


def test_killed_run_resumes_to_the_same_result(uninterrupted, tmp_path):
    """Killed after episode 3 was logged but before the next checkpoint (frame 4000): the rerun resumes from
    frame 2000, drops the row of episode 3 and writes it again, and ends where the straight run ended."""
    run_dir = tmp_path / "killed"
    process = start("pretrain", *RUN, run_dir=run_dir)  # the command below, in the background
    train_csv = run_dir / "pretrain" / "train.csv"
    wait_for_rows(process, train_csv, 3)
    process.send_signal(signal.SIGKILL)
    process.wait()
    checkpoints = run_dir / "pretrain" / "checkpoints"
    assert [p.name for p in list_checkpoints(checkpoints)] == ["checkpoint_2000.pt"]
    assert len(read_csv(train_csv)[1]) == 3 and not (run_dir / "pretrain" / "result.json").exists()

    result = run("pretrain", *RUN, run_dir=run_dir)  # the same command again
    assert_ok(result)
    assert "resuming pretrain from" in result.stdout + result.stderr
    assert "(frame 2000)" in result.stdout + result.stderr

    assert rows_without_timing(run_dir) == rows_without_timing(uninterrupted)  # 5 rows, none twice
    assert_same_agent(final_agent(run_dir), final_agent(uninterrupted))
    assert [p.name for p in list_checkpoints(checkpoints)] == ["checkpoint_2000.pt", "checkpoint_4000.pt"]


def interrupted_line(process) -> str:
    """The one line of a run that Ctrl-C stopped: exit status 130, no traceback, `protorl: ...` last on stderr."""
    _, stderr = process.communicate(timeout=150)
    assert process.returncode == 130, f"exit {process.returncode}\n{stderr}"
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("protorl: ")]
    assert len(lines) == 1 and stderr.rstrip().endswith(lines[0]), stderr
    return lines[0]


def test_ctrl_c_writes_a_checkpoint_says_where_and_the_rerun_resumes_there(uninterrupted, tmp_path):
    """Ctrl-C (a real SIGINT) once the first episode's row is written, in a run with no checkpoint on schedule:
    the run stops at the first episode end it has not finished yet (the first, if the signal comes while its hooks
    still run, or the next), after a checkpoint there, in one line naming it; the same command resumes from it and
    ends as the straight run did."""
    run_dir, command = tmp_path / "ctrl_c", [*RUN, "checkpoints.every_frames=null"]
    process = start("pretrain", *command, run_dir=run_dir, output=True)
    wait_for_rows(process, run_dir / "pretrain" / "train.csv", 1)
    process.send_signal(signal.SIGINT)
    line = interrupted_line(process)
    found = re.search(r"interrupted at frame (\d+) of 5000; the last checkpoint is at frame (\d+) \((.+)\); rerun "
                      r"the same command", line)
    assert found, line
    frames, checkpoint = int(found[1]), int(found[2])
    assert frames == checkpoint and 1000 <= checkpoint < 5000 and checkpoint % 1000 == 0, line  # an episode end
    assert list_checkpoints(run_dir / "pretrain" / "checkpoints") == [Path(found[3])]

    result = run("pretrain", *command, run_dir=run_dir)
    assert_ok(result)
    assert f"(frame {checkpoint})" in result.stdout + result.stderr
    assert rows_without_timing(run_dir) == rows_without_timing(uninterrupted)
    assert_same_agent(final_agent(run_dir), final_agent(uninterrupted))


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    """Two Ctrl-Cs: the run stops without waiting for the episode's end, and says that nothing was saved to
    resume from."""
    run_dir = tmp_path / "twice"
    process = start("pretrain", *RUN, "checkpoints.every_frames=null", "pretrain_frames=20000", run_dir=run_dir,
                    output=True)
    wait_for_rows(process, run_dir / "pretrain" / "train.csv", 1)
    time.sleep(0.3)  # past the first episode's end, whose hooks would take the first Ctrl-C's checkpoint at once
    process.send_signal(signal.SIGINT)
    time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    line = interrupted_line(process)
    assert re.search(r"interrupted at frame \d+ of 20000, before its first checkpoint; rerunning the same command "
                     r"starts this phase again", line), line


def wait_for_a_write(process, directory: Path) -> None:
    """Until the running `process` is writing a file into `directory` (its temporary `*.pt.tmp` is there)."""
    deadline = time.monotonic() + 150
    while not list(directory.glob("*.pt.tmp")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert list(directory.glob("*.pt.tmp")), f"no write into {directory} was seen: nothing to interrupt"


def test_a_second_ctrl_c_during_the_checkpoint_write_stops_once_it_is_whole(tmp_path):
    """Ctrl-C, then Ctrl-C again while the checkpoint the first one asked for is being written (a large replay
    buffer makes the write last): the write completes, the run stops in one line, exit status 130, naming that
    checkpoint, which is whole and resumes."""
    run_dir = tmp_path / "during_write"
    command = [*RUN, "env.obs=states", "checkpoints.every_frames=null", "pretrain_frames=20000",
               "replay.capacity=4000000"]
    process = start("pretrain", *command, run_dir=run_dir, output=True)
    wait_for_rows(process, run_dir / "pretrain" / "train.csv", 1)
    process.send_signal(signal.SIGINT)
    checkpoints = run_dir / "pretrain" / "checkpoints"
    wait_for_a_write(process, checkpoints)
    process.send_signal(signal.SIGINT)
    line = interrupted_line(process)
    found = re.search(r"the last checkpoint is at frame (\d+) \((.+)\); rerun the same command", line)
    assert found, line
    assert list_checkpoints(checkpoints) == [Path(found[2])] and not list(checkpoints.glob("*.tmp"))
    assert load_checkpoint(Path(found[2]))["agent_steps"] * 8 == int(found[1])  # whole: its digest checked


def test_ctrl_c_during_a_snapshot_write_stops_at_that_frame(tmp_path):
    """Ctrl-C while the snapshot at frame 1000 is being written (a snapshot holding a large replay buffer makes the
    write last), just after the checkpoint of the same episode end: the snapshot is completed and the run stops
    there, at frame 1000, rather than running one more episode; the same command resumes from that checkpoint."""
    run_dir = tmp_path / "in_snapshot"
    command = [*RUN, "env.obs=states", "pretrain_frames=3000", "checkpoints.every_frames=1000",
               "snapshots.at_frames=[1000]", "snapshots.with_replay=true", "replay.capacity=4000000"]
    process = start("pretrain", *command, run_dir=run_dir, output=True)
    snapshots = run_dir / "pretrain" / "snapshots"
    wait_for_a_write(process, snapshots)
    process.send_signal(signal.SIGINT)
    line = interrupted_line(process)
    assert "interrupted at frame 1000 of 3000; the last checkpoint is at frame 1000" in line, line
    assert load_snapshot(snapshots / "snapshot_1000.pt")["frames"] == 1000  # whole: its digest checked
    result = run("pretrain", *command, run_dir=run_dir)
    assert_ok(result)
    assert "(frame 1000)" in result.stdout + result.stderr


def test_completed_run_is_not_repeated(uninterrupted):
    """A rerun of a complete phase trains nothing: every file of the run is as it was (result.json holds the
    phase's wall time, so a repeated phase would rewrite it)."""
    def files() -> dict[str, bytes]:
        return {str(p.relative_to(uninterrupted)): p.read_bytes() for p in sorted(uninterrupted.rglob("*"))
                if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log" and p.name != ".lock"}

    before = files()
    assert_ok(run("pretrain", *RUN, run_dir=uninterrupted))
    assert files() == before


def test_checkpoint_holds_everything_to_resume(uninterrupted):
    state = load_checkpoint(list_checkpoints(uninterrupted / "pretrain" / "checkpoints")[-1])
    assert state["agent_steps"] * 8 == 4000 and state["episodes"] == 4
    assert set(state["agent"]) >= {"encoder", "head", "encoder_target", "projector_target", "queue", "sac",
                                   "optimizers"}
    assert set(state["agent"]["optimizers"]) == {"repr"}
    assert set(state["agent"]["sac"]) >= {"actor_optimizer", "critic_optimizer", "alpha_optimizer", "log_alpha"}
    assert state["replay"]["num_written"] == 4000 // 8 + 4  # one first frame per episode (not the 5th's yet)
    assert set(state["rng"]) == {"trainer", "torch", "cuda", "numpy", "python", "env", "eval_env"}
    assert state["rng"]["cuda"] == []  # no CUDA here; where there is, each device's generator


def test_corrupt_checkpoint_is_refused_clearly(uninterrupted, tmp_path):
    path = list_checkpoints(uninterrupted / "pretrain" / "checkpoints")[-1]
    truncated = tmp_path / "checkpoint_1.pt"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=str(truncated)):
        load_checkpoint(truncated)


class _RunsCode:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_malicious_checkpoint_is_refused_not_executed(tmp_path):
    marker = tmp_path / "pickle_ran"
    path = tmp_path / "checkpoint_1.pt"
    torch.save({"checkpoint_version": CHECKPOINT_VERSION, "agent": _RunsCode(marker)}, path)
    with pytest.raises(CheckpointError, match=str(path)) as error:
        load_checkpoint(path)
    assert not marker.exists()
    assert "could run code" in str(error.value) and "weights_only" not in str(error.value)  # not torch's advice
    assert "\n" not in str(error.value)
    # the control: an unguarded load of the same file does run its code (so the check above can fail)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_checkpoint_of_an_older_format_is_refused_with_a_way_out(tmp_path):
    path = tmp_path / "checkpoint_1000.pt"
    torch.save({"checkpoint_version": 3, "agent": {}}, path)  # 4 and 5 resume
    with pytest.raises(CheckpointError, match=r"found 3.*start_over=true"):
        load_checkpoint(path)


def test_checkpoints_by_wall_time(tmp_path):
    """checkpoints.every_minutes alone (frames off): a tiny interval checkpoints at every episode end."""
    run_dir = tmp_path / "timed"
    assert_ok(run("pretrain", *TINY, "task=point_mass_easy", "pretrain_frames=3000", "snapshots.at_frames=[]",
                  "checkpoints.every_frames=null", "checkpoints.every_minutes=0.0001", "checkpoints.keep=5",
                  "checkpoints.keep_completed=true", run_dir=run_dir))
    names = [p.name for p in list_checkpoints(run_dir / "pretrain" / "checkpoints")]
    assert names == ["checkpoint_1000.pt", "checkpoint_2000.pt", "checkpoint_3000.pt"]
