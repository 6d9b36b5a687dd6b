"""A phase's result: what `result.json` records, the marker that the phase is complete."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from protorl.storage.atomic import write_text_atomic
from protorl.storage.digests import sealed_record, unsealed_record, written_digest
from protorl.storage.run_files import RESULT_FILE, SETTINGS_KEY, SNAPSHOT_DIGESTS_KEY
from protorl.storage.rundir import settings_differences

log = logging.getLogger("protorl")


@dataclass
class PhaseResult:
    phase: str
    task: str
    frames: int
    episodes: int
    wall_time_s: float
    out_dir: Path
    eval_rewards: list[tuple[int, float]] = field(default_factory=list)  # (frames, mean episode reward)
    snapshots: list[Path] = field(default_factory=list)

    def save(self, settings: dict[str, object]) -> Path:
        """Write `result.json`, with the digest of its content, into the phase directory, bound to its run: the
        run's `settings` (`protorl.storage.rundir.run_settings`, as its checkpoints record them) and the digest of
        each snapshot it lists. Paths in it are relative to the phase directory, so a copied or moved run
        directory stays whole."""
        path = self.out_dir / RESULT_FILE
        data = {**asdict(self), "out_dir": ".", "snapshots": [_relative(p, self.out_dir) for p in self.snapshots],
                SETTINGS_KEY: settings, SNAPSHOT_DIGESTS_KEY: [written_digest(p) for p in self.snapshots]}
        return write_text_atomic(path, sealed_record(data))

    @classmethod
    def load(cls, out_dir: Path, settings: dict[str, object] | None = None) -> PhaseResult | None:
        """The result of a completed phase in `out_dir`, or None if it has not completed. A `result.json` that is not
        as it was written is taken as not there (the phase runs again); one that is not this run's (`settings`
        differ in a key that changes results, or a snapshot it lists is missing or another file) is moved aside
        (`result.json.other-run`) with a warning naming the difference, and the phase resumes from its own
        checkpoints. A record written before records were bound to their run is taken as it is."""
        path = out_dir / RESULT_FILE
        if not path.exists():
            return None
        try:
            data = unsealed_record(path.read_text())
        except ValueError as error:  # not written whole (by an older protorl), or changed since
            log.warning("%s cannot be read (%s): taking the phase as not complete", path, error)
            return None
        recorded, digests = data.pop(SETTINGS_KEY, None), data.pop(SNAPSHOT_DIGESTS_KEY, None)
        data.update(out_dir=out_dir, snapshots=[_inside(p, out_dir) for p in data["snapshots"]],
                    eval_rewards=[tuple(pair) for pair in data["eval_rewards"]])
        if settings is not None and recorded is not None:
            difference = _not_this_run(recorded, settings, data["snapshots"], digests)
            if difference is not None:
                aside = path.with_name(f"{RESULT_FILE}.other-run")
                log.warning("%s is not this run's (%s); moving it aside (%s), the phase is taken as not complete",
                            path, difference, aside.name)
                path.replace(aside)
                return None
        return cls(**data)

    def state_dict(self) -> dict:
        """Its entries of a checkpoint of the unfinished phase."""
        return {"episodes": self.episodes, "eval_rewards": [list(pair) for pair in self.eval_rewards],
                "snapshots": [_relative(p, self.out_dir) for p in self.snapshots]}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.episodes = int(checkpoint["episodes"])
        self.eval_rewards = [(int(f), float(r)) for f, r in checkpoint["eval_rewards"]]
        self.snapshots = [_inside(p, self.out_dir) for p in checkpoint["snapshots"]]


def _not_this_run(recorded: dict, settings: dict, snapshots: list[Path], digests: list | None) -> str | None:
    """How a result record's run differs from this one, or None if it is this run's."""
    differences = settings_differences(recorded, settings)
    if differences:
        return "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
    if not isinstance(digests, list) or len(digests) != len(snapshots):
        return "its snapshots' digests are not recorded"
    for snapshot, digest in zip(snapshots, digests, strict=True):
        try:
            found = written_digest(snapshot)
        except OSError:
            return f"the snapshot it lists, {snapshot}, is not there"
        if found != digest:
            return f"the snapshot it lists, {snapshot}, is another file (SHA-256 {found}, recorded {digest})"
    return None


def _relative(path: Path, out_dir: Path) -> str:
    """`path` as written into the phase directory's own files: relative to `out_dir`."""
    return str(Path(path).relative_to(out_dir))


def _inside(path: str, out_dir: Path) -> Path:
    """A path read from the phase directory's own files; older absolute ones are taken by their place in it."""
    path = Path(path)
    return out_dir / (Path(*path.parts[-2:]) if path.is_absolute() else path)
