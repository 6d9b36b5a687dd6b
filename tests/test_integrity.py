"""Files that cannot lie: bytes flipped at random offsets in real checkpoints and snapshots are refused or skipped,
never trusted; a run resumed past a corrupted checkpoint ends as the uninterrupted run; what a snapshot lacks, what
a user mistypes, is one line.

Every run here is a tiny run from states driven through the real console commands.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import protorl
from protorl.app.tools import probe
from protorl.errors import SnapshotError, UnreadableFileError
from protorl.storage.checkpoints import list_checkpoints, load_newest_checkpoint
from protorl.storage.snapshots import load_snapshot
from tests.runs import STATES, assert_ok, assert_user_error, read_rows, run, tensorboard_scalars

pytestmark = pytest.mark.slow  # the fault-injection tier: real runs, corrupted files

RUN = [*STATES, "pretrain_frames=4000", "checkpoints.every_frames=1000", "checkpoints.keep_completed=true",
       "checkpoints.keep=4"]
SEEDS = [0, 1, 2]
FINETUNE = [*STATES, "finetune_frames=1000"]


def tensor_bytes(path: Path) -> np.ndarray:
    """The offsets of the bytes of a torch archive's tensor records: what torch reads without checking them."""
    ranges = []
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        for info in archive.infolist():
            if "/data/" in info.filename:
                file.seek(info.header_offset + 26)  # a local file header: 30 bytes, then its name and extra field
                name, extra = struct.unpack("<HH", file.read(4))
                start = info.header_offset + 30 + name + extra
                ranges.append(np.arange(start, start + info.compress_size))
    return np.concatenate(ranges)


def flip_bytes(path: Path, seed: int, in_tensors: bool = False) -> None:
    """Change 2 to 20 bytes of `path` (seed 0: one bit of one byte) at random offsets, anywhere in the file or
    only inside its tensors' bytes."""
    rng = np.random.default_rng(seed)
    data = bytearray(path.read_bytes())
    offsets = tensor_bytes(path) if in_tensors else np.arange(len(data))
    for offset in rng.choice(offsets, size=1 if seed == 0 else int(rng.integers(2, 21)), replace=False):
        data[offset] ^= 1 << int(rng.integers(8)) if seed == 0 else int(rng.integers(1, 256))
    path.write_bytes(bytes(data))


def read_by_torch_alone(path: Path) -> dict:
    """The control: what `torch.load` makes of a corrupted file when nothing checks its digest."""
    return torch.load(path, weights_only=True)


def snapshot_digest_in_comment(path: Path) -> str:
    """The digest a snapshot carries, as any zip reader shows it (`unzip -z`)."""
    comment = zipfile.ZipFile(path).comment.decode()
    assert comment.startswith("protorl sha256 "), comment
    return comment.removeprefix("protorl sha256 ")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The reference: RUN without interruption, every checkpoint kept."""
    run_dir = tmp_path_factory.mktemp("integrity") / "straight"
    assert_ok(run("pretrain", *RUN, run_dir=run_dir))
    return run_dir


def killed_after(straight: Path, tmp_path: Path, frames: int) -> Path:
    """A copy of the straight run as a kill just after its checkpoint at `frames` leaves it: the later checkpoints,
    the final snapshot and result.json not yet written (its logs run ahead of the checkpoint, as after a kill)."""
    run_dir = Path(shutil.copytree(straight, tmp_path / "killed"))
    phase = run_dir / "pretrain"
    (phase / "result.json").unlink()
    (phase / "snapshots" / "snapshot_4000.pt").unlink()
    for path in list_checkpoints(phase / "checkpoints"):
        if int(path.stem.split("_")[1]) > frames:
            path.unlink()
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Logs row for row, TensorBoard scalars and the final snapshot's every tensor bitwise."""
    for name in ("train.csv", "eval.csv"):
        assert read_rows(run_dir / "pretrain" / name) == read_rows(reference / "pretrain" / name), name
    assert tensorboard_scalars(run_dir / "pretrain" / "tb") == tensorboard_scalars(reference / "pretrain" / "tb")
    final = [load_snapshot(d / "pretrain" / "snapshots" / "snapshot_4000.pt")["agent"] for d in (run_dir, reference)]
    for part, tensors in final[1].items():
        for name, tensor in tensors.items():
            other = final[0][part][name]
            assert torch.equal(tensor, other) if isinstance(tensor, torch.Tensor) else tensor == other, (part, name)


# checkpoints: a corrupted one is skipped, and the resume stays exact -----------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_a_corrupted_newest_checkpoint_resumes_from_the_one_before_to_the_same_run(straight, tmp_path, seed):
    """Bytes changed inside the tensors of the newest checkpoint, which torch alone reads without complaint (the
    control): the checkpoint is moved aside and the run resumes from the one before, to the straight run's end."""
    run_dir = killed_after(straight, tmp_path, 3000)
    newest = run_dir / "pretrain" / "checkpoints" / "checkpoint_3000.pt"
    flip_bytes(newest, seed, in_tensors=True)
    assert read_by_torch_alone(newest)["agent_steps"] * 8 == 3000
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    output = result.stdout + result.stderr
    assert f"checkpoint {newest}: its content does not match the digest" in output
    assert "moving it aside (.unreadable), resuming from the checkpoint before it" in output
    assert "resuming pretrain from" in output and "(frame 2000)" in output
    assert newest.with_suffix(".pt.unreadable").is_file()
    assert_same_run(run_dir, straight)


def test_a_corrupted_only_checkpoint_starts_the_phase_again_to_the_same_run(straight, tmp_path):
    run_dir = killed_after(straight, tmp_path, 1000)
    flip_bytes(run_dir / "pretrain" / "checkpoints" / "checkpoint_1000.pt", 3, in_tensors=True)
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    assert "no checkpoint is left before it: the phase starts again" in result.stdout + result.stderr
    assert "resuming pretrain" not in result.stdout + result.stderr
    assert_same_run(run_dir, straight)


@pytest.mark.parametrize("in_tensors", [True, False], ids=["in-tensors", "anywhere"])
@pytest.mark.parametrize("seed", range(4))
def test_no_corrupted_checkpoint_is_ever_loaded(straight, tmp_path, seed, in_tensors):
    """Whatever bytes change, the newest checkpoint is moved aside and the one before it (intact) is loaded."""
    checkpoints = Path(shutil.copytree(straight / "pretrain" / "checkpoints", tmp_path / "checkpoints"))
    flip_bytes(checkpoints / "checkpoint_4000.pt", 10 + seed, in_tensors)
    path, state = load_newest_checkpoint(checkpoints)
    assert path.name == "checkpoint_3000.pt" and state["agent_steps"] * 8 == 3000
    assert (checkpoints / "checkpoint_4000.pt.unreadable").is_file()


# snapshots: a corrupted one is refused in one line, by every reader ----------------------------------------------
@pytest.mark.parametrize("in_tensors", [True, False], ids=["in-tensors", "anywhere"])
@pytest.mark.parametrize("seed", range(4))
def test_a_corrupted_snapshot_is_refused_naming_the_file(straight, tmp_path, seed, in_tensors):
    original = straight / "pretrain" / "snapshots" / "snapshot_4000.pt"
    snapshot = Path(shutil.copy(original, tmp_path / "s.pt"))
    flip_bytes(snapshot, seed, in_tensors)
    if in_tensors:  # the control: torch alone reads other weights without complaint
        changed = read_by_torch_alone(snapshot)["agent"]
        assert any(not torch.equal(tensor, changed[part][name]) for part, tensors in
                   read_by_torch_alone(original)["agent"].items() for name, tensor in tensors.items()
                   if isinstance(tensor, torch.Tensor))
    for read in (load_snapshot, lambda path: protorl.load_pretrained(path, device="cpu")):
        with pytest.raises(UnreadableFileError, match=re.escape(str(snapshot))) as error:
            read(snapshot)
        assert isinstance(error.value, SnapshotError) and "\n" not in str(error.value)


def test_a_corrupted_snapshot_is_refused_by_the_commands(straight, tmp_path, capsys):
    snapshot = Path(shutil.copy(straight / "pretrain" / "snapshots" / "snapshot_4000.pt", tmp_path / "s.pt"))
    flip_bytes(snapshot, 0, in_tensors=True)  # one bit of one weight
    with pytest.raises(SystemExit) as stop:
        probe([str(snapshot), "--samples", "20"])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and error.count("\n") == 0
    assert error.startswith(f"protorl: error: snapshot {snapshot}: its content does not match the digest")
    assert_user_error(run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=tmp_path / "ft"), str(snapshot),
                      "does not match the digest written with it")
    assert not (tmp_path / "ft").exists()


def test_a_fine_tuning_records_its_snapshots_own_digest_and_refuses_it_changed(straight, tmp_path):
    """snapshot_sha256 is the digest the pre-training wrote; once the snapshot changes, rerunning the fine-tuning
    is refused, even though its phase is complete."""
    snapshot = Path(shutil.copy(straight / "pretrain" / "snapshots" / "snapshot_4000.pt", tmp_path / "s.pt"))
    run_dir = tmp_path / "ft"
    assert_ok(run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=run_dir))
    recorded = OmegaConf.load(run_dir / "config.yaml").snapshot_sha256
    written = snapshot_digest_in_comment(snapshot)
    assert recorded == written == hashlib.sha256(snapshot.read_bytes()[:-len(f"protorl sha256 {written}")]
                                                 ).hexdigest()
    flip_bytes(snapshot, 4, in_tensors=True)
    assert_user_error(run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=run_dir), str(snapshot),
                      "does not match the digest")


def test_a_snapshot_written_before_digests_is_fine_tuned_with_a_note(straight, tmp_path):
    """What protorl 0.2.0 wrote, `torch.save` of the same payload without a digest: it is used, with one line
    saying it cannot be verified, and recorded by the SHA-256 of the file."""
    older = tmp_path / "older.pt"
    torch.save(read_by_torch_alone(straight / "pretrain" / "snapshots" / "snapshot_4000.pt"), older)
    result = run("finetune", *FINETUNE, f"snapshot={older}", run_dir=tmp_path / "ft")
    assert_ok(result)
    notes = [line for line in (result.stdout + result.stderr).splitlines() if "cannot be verified" in line]
    assert len(notes) == 1 and str(older) in notes[0] and "without a digest" in notes[0]
    assert OmegaConf.load(tmp_path / "ft" / "config.yaml").snapshot_sha256 == \
        hashlib.sha256(older.read_bytes()).hexdigest()


# what a snapshot lacks, what a user mistypes: one line -----------------------------------------------------------
def test_a_hollow_snapshot_is_one_line_from_every_command(tmp_path, capsys):
    hollow = tmp_path / "h.pt"
    torch.save({"format_version": 3, "agent": {}, "env_spec": {}, "config": {}, "frames": 0}, hollow)
    with pytest.raises(SystemExit) as stop:
        probe([str(hollow)])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and error.count("\n") == 0 and f"snapshot {hollow}: incomplete" in error
    line = assert_user_error(run("finetune", *FINETUNE, f"snapshot={hollow}", run_dir=tmp_path / "ft"), str(hollow),
                             "incomplete")
    assert "agent=None" not in line


def test_a_snapshot_that_would_run_code_is_one_line_without_torchs_advice(tmp_path):
    class RunsCode:
        def __reduce__(self):
            return (print, ("ran",))

    evil = tmp_path / "evil.pt"
    torch.save({"format_version": 3, "agent": RunsCode(), "env_spec": {}, "config": {}, "frames": 0}, evil)
    line = assert_user_error(run("finetune", *FINETUNE, f"snapshot={evil}", run_dir=tmp_path / "ft"), str(evil),
                             "could run code")
    assert "weights_only" not in line


def test_a_run_directory_name_too_long_is_one_line(tmp_path):
    assert_user_error(run("pretrain", *RUN, run_dir=tmp_path / ("a" * 300)), "File name too long")


def test_an_unquoted_path_hydra_cannot_read_is_one_line_saying_to_quote_it(tmp_path):
    result = run("finetune", *FINETUNE, f"snapshot={tmp_path}/é.pt", run_dir=tmp_path / "ft")
    assert_user_error(result, "cannot read the override", "must be quoted", f"\"snapshot='{tmp_path}/é.pt'\"")
