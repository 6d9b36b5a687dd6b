"""Files that cannot lie: bytes flipped at random offsets in real checkpoints and snapshots are refused or skipped,
never trusted; a run resumed past a corrupted checkpoint ends as the uninterrupted run; what a snapshot lacks, what
a user mistypes, is one line.

Every run here is a tiny run from states driven through the real console commands.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import protorl
from protorl.app.tools import probe
from protorl.errors import SnapshotError, UnreadableFileError
from protorl.reports.io import read_result
from protorl.storage.checkpoints import list_checkpoints, load_checkpoint, load_newest_checkpoint
from protorl.storage.digests import unsealed_record
from protorl.storage.snapshots import load_snapshot, save_snapshot
from tests.runs import STATES, assert_ok, assert_user_error, environment, read_rows, run, tensorboard_scalars

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
    payload = read_by_torch_alone(straight / "pretrain" / "snapshots" / "snapshot_4000.pt")
    torch.save({**payload, "format_version": 3}, older)  # format 4 is always written with a digest
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


# files that are not this run's, or lost their digest: never trusted ------------------------------------------------
def strip_digest(path: Path) -> None:
    """Remove the digest from a protorl archive as a zip tool rewriting its comment would: the file ends as one
    written before digests existed."""
    data = bytearray(path.read_bytes()[:-len("protorl sha256 ") - 64])
    data[-2:] = b"\0\0"  # the end record's comment length
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def other_runs(tmp_path_factory) -> dict[str, Path]:
    """RUN with one setting changed (a learning rate; the seed), to 3000 frames: the checkpoints of other runs."""
    root = tmp_path_factory.mktemp("other")
    runs = {}
    for name, override in (("lr", "agent.lr=0.0003"), ("seed", "seed=2")):
        runs[name] = root / name
        assert_ok(run("pretrain", *RUN, override, "pretrain_frames=3000", run_dir=runs[name]))
    return runs


@pytest.mark.parametrize(("other", "named"), [("lr", "agent.lr=0.0003 (now 0.0001)"),
                                              ("seed", "pretrain on point_mass_easy seed 2, not pretrain on "
                                                       "point_mass_easy seed 1")])
def test_a_checkpoint_of_another_run_is_moved_aside_and_the_run_resumes_its_own(straight, other_runs, tmp_path,
                                                                                 other, named):
    """The newest checkpoint replaced by another run's (one setting or the seed differs): named in one line, moved
    aside, and the run resumes from its own checkpoint before it, to the straight run's end."""
    run_dir = killed_after(straight, tmp_path, 2000)
    foreign = run_dir / "pretrain" / "checkpoints" / "checkpoint_3000.pt"
    shutil.copy(other_runs[other] / "pretrain" / "checkpoints" / "checkpoint_3000.pt", foreign)
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "of another run" in line]
    assert len(lines) == 1 and f"checkpoint {foreign} is of another run" in lines[0] and named in lines[0], lines
    assert "moving it aside (.other-run), resuming from the checkpoint before it" in lines[0]
    assert foreign.with_suffix(".pt.other-run").is_file()
    assert_same_run(run_dir, straight)


def test_a_checkpoint_whose_digest_was_stripped_is_corrupted_not_old(straight, tmp_path):
    """Its version says it was written with a digest: without one, and with a bit flipped, it is moved aside as
    unreadable and the run resumes from the checkpoint before it, to the straight run's end."""
    run_dir = killed_after(straight, tmp_path, 3000)
    newest = run_dir / "pretrain" / "checkpoints" / "checkpoint_3000.pt"
    strip_digest(newest)
    flip_bytes(newest, 0, in_tensors=True)
    assert read_by_torch_alone(newest)["checkpoint_version"] == 5  # torch alone reads it
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    output = result.stdout + result.stderr
    assert f"checkpoint {newest}: has no digest, although its checkpoint_version 5 is always written with one" in \
        output
    assert "without a digest" not in output  # not taken for a file of before digests
    assert newest.with_suffix(".pt.unreadable").is_file()
    assert_same_run(run_dir, straight)


def test_a_snapshot_whose_digest_was_stripped_is_refused_in_one_line(straight, tmp_path, capsys):
    snapshot = Path(shutil.copy(straight / "pretrain" / "snapshots" / "snapshot_4000.pt", tmp_path / "s.pt"))
    strip_digest(snapshot)
    with pytest.raises(UnreadableFileError, match=r"has no digest, although its format_version 4"):
        load_snapshot(snapshot)
    with pytest.raises(SystemExit) as stop:
        probe([str(snapshot), "--samples", "20"])
    assert stop.value.code == 2 and capsys.readouterr().err.strip().count("\n") == 0
    assert_user_error(run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=tmp_path / "ft"), str(snapshot),
                      "has no digest")
    assert not (tmp_path / "ft").exists()


def test_a_result_record_whose_digest_was_removed_is_not_taken_as_complete(straight, tmp_path):
    """result.json with its `sha256` key removed and its frames edited: the phase is not taken as complete, by the
    run (which resumes it from its checkpoint, to the same end) or by the reports."""
    run_dir = Path(shutil.copytree(straight, tmp_path / "edited"))
    record = run_dir / "pretrain" / "result.json"
    data = json.loads(record.read_text())
    del data["sha256"]
    data["frames"] = 99
    record.write_text(json.dumps(data))
    assert read_result(run_dir / "pretrain") is None
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    assert f"{record} cannot be read (it has no digest, although its record_version 2" in \
        result.stdout + result.stderr
    assert unsealed_record(record.read_text())["frames"] == 4000
    assert_same_run(run_dir, straight)


def test_a_result_record_of_another_run_is_moved_aside_and_the_phase_resumes_its_own(straight, other_runs, tmp_path):
    """A complete run's result.json copied into a run killed after its checkpoint at 1000 frames (the other run's
    learning rate differs): not taken as this run's completion but named, moved aside, and the phase resumes from
    its own checkpoint to the straight run's end."""
    run_dir = killed_after(straight, tmp_path, 1000)
    record = run_dir / "pretrain" / "result.json"
    shutil.copy(other_runs["lr"] / "pretrain" / "result.json", record)
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    output = result.stdout + result.stderr
    assert "already complete" not in output
    assert (f"{record} is not this run's (agent.lr=0.0003 (now 0.0001); pretrain_frames=3000 (now 4000)); moving "
            "it aside (result.json.other-run)") in output
    assert "resuming pretrain from" in output
    assert unsealed_record(record.with_name("result.json.other-run").read_text())["settings"]["agent.lr"] == 0.0003
    assert_same_run(run_dir, straight)


def test_a_result_record_listing_a_snapshot_that_is_another_file_is_not_trusted(straight, other_runs, tmp_path):
    """The settings match, but a snapshot the record lists was replaced: the record is moved aside."""
    run_dir = Path(shutil.copytree(straight, tmp_path / "swapped"))
    snapshots = run_dir / "pretrain" / "snapshots"
    shutil.copy(other_runs["lr"] / "pretrain" / "snapshots" / "snapshot_3000.pt", snapshots / "snapshot_4000.pt")
    result = run("pretrain", *RUN, run_dir=run_dir)
    assert_ok(result)
    assert f"the snapshot it lists, {snapshots / 'snapshot_4000.pt'}, is another file" in result.stdout + result.stderr
    assert (run_dir / "pretrain" / "result.json.other-run").is_file()
    assert_same_run(run_dir, straight)  # every checkpoint was kept: resumed from the last one, the snapshot rewritten


@pytest.mark.parametrize("state", ["complete", "killed"])
def test_an_edited_config_yaml_is_refused_quoting_what_the_run_recorded(straight, tmp_path, state):
    """config.yaml edited after the run wrote its data (agent.lr 0.0001 -> 0.0003): a rerun with the edited value or
    with the recorded one is refused in one line quoting the recorded value and where it was read (the result
    record, or a checkpoint of a killed run); nothing is changed."""
    run_dir = killed_after(straight, tmp_path, 2000) if state == "killed" else \
        Path(shutil.copytree(straight, tmp_path / "complete"))
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.0001", "lr: 0.0003", 1))
    assert OmegaConf.load(config).agent.lr == 0.0003
    before = sorted((path.relative_to(run_dir), path.stat().st_mtime_ns) for path in run_dir.rglob("*"))
    source = "result.json" if state == "complete" else "checkpoint_2000.pt"
    for lr in ("0.0003", "0.0001"):
        line = assert_user_error(run("pretrain", *RUN, f"agent.lr={lr}", run_dir=run_dir), "config.yaml was changed",
                                 "agent.lr=0.0001 (config.yaml: 0.0003)", source)
        assert "already complete" not in line
    after = sorted((path.relative_to(run_dir), path.stat().st_mtime_ns) for path in run_dir.rglob("*")
                   if path.name != ".lock" and ".hydra" not in path.parts and path.suffix != ".log")
    assert after == [item for item in before if item[0].name != ".lock" and ".hydra" not in item[0].parts
                     and item[0].suffix != ".log"]


def test_a_digest_mismatch_names_both_digests_whole(straight, tmp_path):
    checkpoint = Path(shutil.copy(straight / "pretrain" / "checkpoints" / "checkpoint_1000.pt", tmp_path / "c.pt"))
    flip_bytes(checkpoint, 0, in_tensors=True)
    with pytest.raises(UnreadableFileError) as error:
        load_checkpoint(checkpoint)
    found, written = re.search(r"SHA-256 ([0-9a-f]{64}) now, ([0-9a-f]{64}) when written", str(error.value)).groups()
    assert found != written


# non-finite weights: refused before anything is written ------------------------------------------------------------
def test_a_snapshot_with_non_finite_weights_is_refused_in_one_line_everywhere(straight, tmp_path, capsys):
    """A pre-training that diverged wrote NaN into its actor: with a valid digest, the snapshot is refused by
    load_pretrained, the probe and the fine-tuning, each in one line, before a run directory is written."""
    payload = load_snapshot(straight / "pretrain" / "snapshots" / "snapshot_4000.pt")
    weight = next(key for key, value in payload["agent"]["actor"].items() if value.is_floating_point())
    payload["agent"]["actor"][weight][0] = float("nan")
    snapshot = save_snapshot(tmp_path / "nan.pt", payload["agent"], payload["env_spec"], payload["config"],
                             payload["frames"])
    with pytest.raises(SnapshotError, match=rf"agent\.actor\.{re.escape(weight)} hold non-finite values"):
        protorl.load_pretrained(snapshot)
    with pytest.raises(SystemExit) as stop:
        probe([str(snapshot), "--samples", "20"])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and error.count("\n") == 0 and "non-finite values" in error
    assert_user_error(run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=tmp_path / "ft"), str(snapshot),
                      "non-finite values")
    assert not (tmp_path / "ft").exists()


# interrupted writes: one line, nothing lost -------------------------------------------------------------------------
def test_a_checkpoint_write_the_disk_cannot_take_is_one_line_and_loses_nothing(tmp_path):
    """The disk refuses the first checkpoint's bytes part way (here: a limit on the size of any file the process
    writes, the write failing with EFBIG as on a full disk with ENOSPC): one line naming the file and the cause,
    exit status 2, no temporary file left; rerun without the limit, the run ends as one never stopped."""
    reference = tmp_path / "reference"
    assert_ok(run("pretrain", *RUN, "pretrain_frames=2000", run_dir=reference))
    size = (reference / "pretrain" / "checkpoints" / "checkpoint_1000.pt").stat().st_size
    run_dir = tmp_path / "limited"
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, resource.RLIM_INFINITY))  # noqa: E731
    result = run("pretrain", *RUN, "pretrain_frames=2000", run_dir=run_dir, preexec_fn=limit)
    line = assert_user_error(result, f"cannot write {run_dir / 'pretrain' / 'checkpoints' / 'checkpoint_1000.pt'}",
                             "File too large")
    assert "Traceback" not in result.stderr and line
    assert not list((run_dir / "pretrain" / "checkpoints").glob("*"))  # neither the checkpoint nor its .tmp
    assert_ok(run("pretrain", *RUN, "pretrain_frames=2000", run_dir=run_dir))
    for name in ("train.csv", "eval.csv"):
        assert read_rows(run_dir / "pretrain" / name) == read_rows(reference / "pretrain" / name), name


DISK_REFUSES_PART_WAY = """
import resource, sys, torch
from pathlib import Path
from protorl.storage.atomic import atomic_save
from protorl.errors import CheckpointError

path = Path(sys.argv[1])
atomic_save({"old": torch.ones(3)}, path)
# the disk takes this many bytes of a file and no more: the write fails before, inside or after torch's records
for limit in (1000, 5000, 20000, 60000, 150000):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        atomic_save({"a": torch.zeros(50000), "b": torch.ones(20000), "c": list(range(1000))}, path)
    except CheckpointError as error:
        print(limit, error, sorted(p.name for p in path.parent.iterdir()))
"""


def test_a_write_the_disk_refuses_part_way_is_one_error_naming_the_file_and_the_cause(tmp_path):
    """Wherever the disk stops taking bytes (a file-size limit: EFBIG, as a full disk gives ENOSPC), even inside
    torch's archive writer, which reports it as an error of its own: one `CheckpointError` with the cause, the
    temporary file removed, the file before it intact."""
    path = tmp_path / "f.pt"
    result = subprocess.run([sys.executable, "-c", DISK_REFUSES_PART_WAY, str(path)], capture_output=True, text=True,
                            timeout=120, env=environment())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 5, result.stdout
    for line in lines:
        assert line.endswith(f"cannot write {path}: File too large ['f.pt']"), line


CTRL_C_DURING_A_WRITE = """
import os, signal, sys, time
from pathlib import Path
import torch
from protorl.storage.atomic import atomic_save, safe_load

path = Path(sys.argv[1])
atomic_save({"old": torch.ones(3)}, path)
tmp = path.with_suffix(".pt.tmp")
save = torch.save
def save_pressing_ctrl_c(payload, file):  # Ctrl-C once the write into the temporary file has begun
    assert tmp.exists()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)  # the signal is handled here, inside the write
    save(payload, file)
torch.save = save_pressing_ctrl_c
try:
    atomic_save({"new": torch.zeros(2**24)}, path)
except KeyboardInterrupt:
    payload, digest = safe_load(path, "file", RuntimeError, ("format", 1))
    print("interrupted after the write:", sorted(payload), digest is not None, tmp.exists())
"""


def test_ctrl_c_during_a_write_takes_effect_once_the_file_is_whole(tmp_path):
    """Ctrl-C (a real SIGINT) while a file is being written: torch's writer is not interrupted mid-record (which can
    abort the process); the interrupt is raised once the file is whole, and the file is the new one."""
    result = subprocess.run([sys.executable, "-c", CTRL_C_DURING_A_WRITE, str(tmp_path / "f.pt")],
                            capture_output=True, text=True, timeout=300, env=environment(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal,
    # also where a shell started the tests in the background (which ignores SIGINT for them and their children)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "interrupted after the write: ['new'] True False", result.stdout + result.stderr
