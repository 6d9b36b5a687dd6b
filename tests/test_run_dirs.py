"""A run directory cannot lie: its config.yaml describes its data, one run writes it at a time, nothing logged is
lost or repeated across kills, and every bad input is one `protorl: error:` line.

Every test drives the real console commands on tiny runs from states (subprocesses, seconds each).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from protorl.config import GROUPS, RENAMED
from protorl.errors import CheckpointError
from protorl.storage.atomic import atomic_save
from protorl.storage.checkpoints import list_checkpoints
from tests.runs import (
    STATES,
    assert_ok,
    assert_user_error,
    csv_rows,
    read_rows,
    run,
    start,
    tensorboard_scalars,
    tree,
)

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

RUN = [*STATES, "pretrain_frames=4000", "checkpoints.every_frames=1000"]


def wait_for(condition, process: subprocess.Popen | None = None, timeout_s: float = 120, poll_s: float = 0.005):
    deadline = time.time() + timeout_s
    while not condition():
        assert process is None or process.poll() is None, "the run ended first"
        assert time.time() < deadline, "timed out"
        time.sleep(poll_s)


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The reference: RUN without interruption."""
    run_dir = tmp_path_factory.mktemp("rundirs") / "straight"
    assert_ok(run("pretrain", *RUN, run_dir=run_dir))
    return run_dir


def same_logs(run_dir: Path, reference: Path, phase: str = "pretrain") -> None:
    for name in ("train.csv", "eval.csv"):
        assert read_rows(run_dir / phase / name) == read_rows(reference / phase / name), name
    resumed, expected = tensorboard_scalars(run_dir / phase / "tb"), tensorboard_scalars(reference / phase / "tb")
    assert len(expected) > 0 and resumed == expected


def copy_of(run_dir: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / name, symlinks=True))


# 1. a rerun with other settings ----------------------------------------------------------------------------
@pytest.mark.parametrize("changed", [["task=walker_walk", "seed=7"], ["env.obs=pixels"], ["agent.lr=0.001"]])
def test_a_rerun_with_other_settings_is_refused_and_writes_nothing(straight, tmp_path, changed):
    run_dir = copy_of(straight, tmp_path)
    before = tree(run_dir)
    error = assert_user_error(run("pretrain", *RUN, *changed, run_dir=run_dir), "other settings")
    for override in changed:
        assert override.split("=")[0] + "=" in error
    assert tree(run_dir) == before


def test_a_rerun_of_the_variant_as_agent_proto_is_told_the_variants_name(straight, tmp_path):
    """preset=small runs the working variant (agent=proto_variant); agent=proto is the published algorithm, so a
    rerun naming agent=proto is another run, and the refusal names both."""
    run_dir = copy_of(straight, tmp_path)
    before = tree(run_dir)
    assert_user_error(run("pretrain", *RUN, "agent=proto", run_dir=run_dir), "other settings",
                      "agent.anti_collapse='center' (now 'none')", "agent=proto_variant")
    assert tree(run_dir) == before


def test_a_rerun_with_the_same_settings_continues(straight, tmp_path):
    """Keys that change how a run is watched (progress bar, checkpointing) may differ."""
    run_dir = copy_of(straight, tmp_path)
    result = run("pretrain", *RUN, "logging.progress_bar=true", "checkpoints.every_frames=2000", run_dir=run_dir)
    assert_ok(result)
    assert "already complete" in result.stderr + result.stdout
    assert read_rows(run_dir / "pretrain" / "train.csv") == read_rows(straight / "pretrain" / "train.csv")
    assert OmegaConf.load(run_dir / "config.yaml").checkpoints.every_frames != 2000  # the data's own settings stay


def test_a_run_directory_saved_with_the_flat_keys_continues(straight, tmp_path):
    """A config.yaml written before the settings were grouped (`env` its task, `replay_capacity`, ...) is read on
    today's keys: the same settings continue the run, other ones are refused naming today's key."""
    run_dir = copy_of(straight, tmp_path)
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    flat_key = {new: old for old, new in RENAMED.items()}
    flat = {flat_key.get(key, key): value for key, value in saved.items() if key not in GROUPS}
    for group in GROUPS:  # the keys added since the grouping had no flat name: a config.yaml of before lacks them
        flat.update({flat_key[f"{group}.{key}"]: value for key, value in saved[group].items()
                     if f"{group}.{key}" in flat_key})
    assert flat["env"] == "point_mass_easy" and flat["replay_capacity"] == 2000
    OmegaConf.save(flat, run_dir / "config.yaml")
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    assert "already complete" in result.stderr + result.stdout
    assert_user_error(run("pretrain", *RUN, "replay.capacity=3000", run_dir=run_dir), "other settings",
                      "replay.capacity=2000 (now 3000)")


def test_a_rerun_with_other_threads_is_refused(straight, tmp_path):
    """torch's thread count changes the numbers (its reductions split otherwise): a run continued with another
    would mix two settings that neither reproduces alone."""
    run_dir = copy_of(straight, tmp_path)
    assert_user_error(run("pretrain", *RUN, "runtime.threads=2", run_dir=run_dir), "other settings",
                      "runtime.threads=1 (now 2)")


def test_a_config_yaml_cut_short_is_refused_not_ignored(straight, tmp_path):
    run_dir = copy_of(straight, tmp_path)
    config = run_dir / "config.yaml"
    config.write_text(config.read_text()[:40])  # e.g. a disk that filled while an older protorl wrote it
    before = tree(run_dir)
    assert_user_error(run("pretrain", *RUN, "seed=7", run_dir=run_dir), "config.yaml", "cannot be read")
    assert tree(run_dir) == before


@pytest.mark.parametrize("damage", ["emptied", "changed"])
def test_an_unreadable_or_changed_result_json_reruns_the_phase(straight, tmp_path, damage):
    """A result.json that is not whole, or that no longer matches its digest, does not mark the phase complete:
    the rerun trains it again, with fresh logs, to the straight run's rows."""
    run_dir = copy_of(straight, tmp_path)
    path = run_dir / "pretrain" / "result.json"
    text = path.read_text()
    changed = text.replace('"episodes": 4,', '"episodes": 5,')
    assert changed != text
    path.write_text("" if damage == "emptied" else changed)
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    reason = "its content does not match the digest written with it" if damage == "changed" else "Expecting value"
    assert f"cannot be read ({reason}" in result.stderr + result.stdout
    assert "taking the phase as not complete" in result.stderr + result.stdout
    same_logs(run_dir, straight)
    assert json.loads((run_dir / "pretrain" / "result.json").read_text())["frames"] == 4000


def test_start_over_deletes_only_what_the_run_wrote(straight, tmp_path):
    run_dir = copy_of(straight, tmp_path)
    (run_dir / "finetune_old").mkdir()
    (run_dir / "finetune_old" / "mine.txt").write_text("a user's backup")
    (run_dir / "notes.txt").write_text("a user's notes")
    assert_ok(run("pretrain", *RUN, "pretrain_frames=2000", "start_over=true", run_dir=run_dir))
    assert (run_dir / "finetune_old" / "mine.txt").is_file() and (run_dir / "notes.txt").is_file()
    assert len(read_rows(run_dir / "pretrain" / "train.csv")) == 2


def test_logs_shorter_than_the_checkpoint_says_are_not_padded(tmp_path):
    """After an OS crash a checkpoint (fsync'ed) can outlive the tail of a log: resuming keeps the log as it is
    instead of extending it with zero bytes."""
    from protorl.logs.logger import Logger

    logger = Logger(tmp_path, (), tensorboard=True)
    for frames in (1000, 2000):
        logger.log_train({"frames": frames, "episode": frames // 1000})
    state = logger.state_dict(2000)
    logger.close()
    train_csv = tmp_path / "train.csv"
    kept = train_csv.read_bytes()[: state["train_csv"] - 10]
    train_csv.write_bytes(kept)
    resumed = Logger(tmp_path, (), tensorboard=True)
    resumed.load_state_dict(state)
    resumed.close()
    assert train_csv.read_bytes() == kept and b"\x00" not in train_csv.read_bytes()


# 2. one run at a time; resume=false over data ----------------------------------------------------------------
def test_a_second_run_in_a_busy_directory_is_refused(tmp_path):
    run_dir = tmp_path / "busy"
    first = start("pretrain", *STATES, "pretrain_frames=50000", run_dir=run_dir)  # still running when refused
    try:
        wait_for(lambda: csv_rows(run_dir / "pretrain" / "train.csv") >= 1, first)
        assert_user_error(run("pretrain", *STATES, "pretrain_frames=50000", run_dir=run_dir), "in use by process",
                          str(first.pid))
        assert first.poll() is None
    finally:
        kill(first)
    episodes = [row["episode"] for row in read_rows(run_dir / "pretrain" / "train.csv")]
    assert episodes == [str(n) for n in range(1, len(episodes) + 1)]  # one writer: no row twice


def test_resume_false_over_data_is_refused_and_start_over_starts_again(straight, tmp_path):
    run_dir = copy_of(straight, tmp_path)
    before = tree(run_dir)
    assert_user_error(run("pretrain", *RUN, "resume=false", run_dir=run_dir), "start_over=true")
    assert tree(run_dir) == before
    assert_ok(run("pretrain", *RUN, "pretrain_frames=2000", "seed=2", "start_over=true", run_dir=run_dir))
    assert OmegaConf.load(run_dir / "config.yaml").seed == 2
    assert [row["episode"] for row in read_rows(run_dir / "pretrain" / "train.csv")] == ["1", "2"]


# 3 and 8. every bad input: one line, exit 2, no run directory ------------------------------------------------
@pytest.mark.parametrize("override, named", [
    ("+agent.batchsize=3", "batchsize"), ("+pretrain_frame=100", "pretrain_frame"), ("nokey=1", "nokey"),
    ("seed=abc", "seed"), ("seed=-1", "seed"), ("seed=5000000000", "seed"), ("seed=5e9", "seed"),
    ("env.camera_id=99", "env.camera_id"), ("agent.lr=nan", "agent.lr"), ("replay.capacity=1", "replay.capacity"),
    ("pretrain_frames=100", "no agent update"), ("agent=nope", "agent=nope: no such agent"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, override, named):
    run_dir = tmp_path / "never"
    assert_user_error(run("pretrain", *RUN, override, run_dir=run_dir), named)
    assert not run_dir.exists()


# 4, 9, 12 and the fault injection: kills at random points, inside checkpoint writes too -------------------------
@pytest.mark.parametrize("kill_seed", [0, 1])
def test_a_run_killed_at_random_points_ends_with_the_same_logs(straight, tmp_path, kill_seed):
    """Two SIGKILLs at random times (after 0-100% of the straight run's episodes), then a run to the end: the
    CSVs and TensorBoard scalars equal the straight run's, no file outside the run directory changed, no
    checkpoint or temporary file is left."""
    rng = np.random.default_rng(kill_seed)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("unchanged")
    before = tree(tmp_path)
    run_dir = tmp_path / "killed"
    for _ in range(2):
        process = start("pretrain", *RUN, run_dir=run_dir)
        episodes = int(rng.integers(0, 4))
        wait_for(lambda: csv_rows(run_dir / "pretrain" / "train.csv") >= episodes, process)  # noqa: B023
        time.sleep(float(rng.uniform(0.0, 1.0)))
        if process.poll() is None:
            kill(process)
    assert_ok(run("pretrain", *RUN, run_dir=run_dir))
    same_logs(run_dir, straight)
    assert tree(tmp_path, skip=run_dir) == before
    assert not (run_dir / "pretrain" / "checkpoints").exists()
    assert not list(run_dir.rglob("*.tmp"))


def test_a_run_killed_inside_a_checkpoint_write_resumes(straight, tmp_path):
    """Killed while the temporary file of a checkpoint is being written: the rerun removes it, resumes from
    the checkpoint before and ends with the straight run's logs (the point at the checkpoint's frame kept)."""
    run_dir = tmp_path / "in_write"
    checkpoints = run_dir / "pretrain" / "checkpoints"
    for _ in range(10):  # a write lasts milliseconds: poll until one is caught mid-way
        process = start("pretrain", *RUN, "agent.hidden_dim=512", "start_over=true", run_dir=run_dir)
        try:
            wait_for(lambda: any(checkpoints.glob("checkpoint_2000.pt.tmp")), process, poll_s=0.0005)
        except AssertionError:
            process.wait()
            continue
        kill(process)
        if any(checkpoints.glob("*.tmp")):
            break
    else:
        pytest.fail("no kill landed inside a checkpoint write in 10 tries")
    assert [path.name for path in list_checkpoints(checkpoints)] == ["checkpoint_1000.pt"]
    result = run("pretrain", *RUN, "agent.hidden_dim=512", run_dir=run_dir)
    assert_ok(result)
    assert "(frame 1000)" in result.stderr + result.stdout
    assert not list(run_dir.rglob("*.tmp"))
    reference = tmp_path / "reference"
    assert_ok(run("pretrain", *RUN, "agent.hidden_dim=512", run_dir=reference))
    same_logs(run_dir, reference)


def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(straight, tmp_path):
    """9: a truncated newest checkpoint is deleted with a warning, the older one resumes; a stray
    checkpoint_best.pt is not taken for a checkpoint."""
    run_dir = tmp_path / "fallback"
    checkpoints = run_dir / "pretrain" / "checkpoints"
    process = start("pretrain", *RUN, run_dir=run_dir)
    wait_for(lambda: len(list_checkpoints(checkpoints)) == 2 and csv_rows(run_dir / "pretrain" / "train.csv") >= 2,
             process)
    kill(process)
    newest = list_checkpoints(checkpoints)[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    shutil.copy(list_checkpoints(checkpoints)[0], checkpoints / "checkpoint_best.pt")
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    output = result.stderr + result.stdout
    assert "moving it aside (.unreadable), resuming from the checkpoint before it" in output
    assert newest.name in output and newest.with_suffix(".pt.unreadable").is_file()
    same_logs(run_dir, straight)


# 5. paths inside a run directory are its own ------------------------------------------------------------------
def test_a_moved_run_directory_uses_its_own_snapshots(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    assert_ok(run("pretrain", *RUN, "pretrain_frames=2000", "finetune_frames=1000", run_dir=first))
    result = json.loads((first / "pretrain" / "result.json").read_text())
    assert not any(os.path.isabs(path) for path in [result["out_dir"], *result["snapshots"]])
    shutil.move(first, moved)
    # protorl-train finds pre-training complete and fine-tunes from the moved directory's snapshot
    assert_ok(run("train", *RUN, "pretrain_frames=2000", "finetune_frames=1000", run_dir=moved))
    assert (moved / "finetune" / "result.json").is_file()


# 6 and 7. writing errors, the free-space rule -----------------------------------------------------------------
def _file_size_limit(limit_bytes: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


def test_a_write_that_fails_midway_is_one_line(tmp_path):
    """A file-size limit below a checkpoint's size (~230 kB) and above the logs': the checkpoint write fails
    midway, as on a full disk."""
    run_dir = tmp_path / "full"
    result = run("pretrain", *RUN, run_dir=run_dir, preexec_fn=_file_size_limit(128 * 1024))
    assert_user_error(result, "cannot write", "checkpoint_1000.pt", "File too large")
    assert not list(run_dir.rglob("*.tmp"))


def test_a_read_only_checkpoint_directory_is_one_line(straight, tmp_path, mount):
    run_dir = copy_of(straight, tmp_path)
    mount(run_dir / "finetune" / "checkpoints", "ro,size=64m")
    result = run("train", *RUN, run_dir=run_dir)
    assert_user_error(result, "cannot write", "checkpoint_1000.pt", "Read-only file system")


def test_a_read_only_run_directory_is_one_line(tmp_path, mount):
    run_dir = mount(tmp_path / "readonly", "ro,size=64m")
    assert_user_error(run("pretrain", *RUN, run_dir=run_dir), str(run_dir), "Read-only file system")


def test_a_snapshot_fits_a_disk_just_larger_than_it(tmp_path, mount):
    """7: a ~8 MB snapshot on a 30 MiB disk (the fixed 64 MiB margin refused it after the whole phase)."""
    disk = mount(tmp_path / "small_disk", "size=30m")
    run_dir = disk / "run"
    assert_ok(run("pretrain", *STATES, "pretrain_frames=1000", "agent.hidden_dim=1024",
                  "checkpoints.every_frames=null", run_dir=run_dir))
    snapshot = run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt"
    assert snapshot.stat().st_size > 4 * 2**20


def test_a_file_larger_than_the_free_space_is_refused_before_writing(tmp_path):
    huge = {"weights": torch.zeros(1).expand(2**50)}  # 4 PiB by its size, no memory
    with pytest.raises(CheckpointError, match="free"):
        atomic_save(huge, tmp_path / "huge.pt")
    assert list(tmp_path.iterdir()) == []


# 12. what a finished phase keeps -----------------------------------------------------------------------------
def test_a_finished_phase_drops_its_checkpoints_unless_asked(straight, tmp_path):
    assert not (straight / "pretrain" / "checkpoints").exists()
    assert len(list((straight / "pretrain" / "tb").iterdir())) == 1
    kept = tmp_path / "kept"
    assert_ok(run("pretrain", *RUN, "pretrain_frames=2000", "checkpoints.keep_completed=true", run_dir=kept))
    assert [p.name for p in list_checkpoints(kept / "pretrain" / "checkpoints")] == \
        ["checkpoint_1000.pt", "checkpoint_2000.pt"]
