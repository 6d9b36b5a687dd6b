"""A phase's result: what `result.json` records, the marker that the phase is complete."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from protorl.storage.atomic import write_text_atomic
from protorl.storage.digests import sealed_record, unsealed_record
from protorl.storage.run_files import RESULT_FILE

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

    def save(self) -> Path:
        """Write `result.json`, with the digest of its content, into the phase directory. Paths in it are relative
        to the phase directory, so a copied or moved run directory stays whole."""
        path = self.out_dir / RESULT_FILE
        data = {**asdict(self), "out_dir": ".", "snapshots": [_relative(p, self.out_dir) for p in self.snapshots]}
        return write_text_atomic(path, sealed_record(data))

    @classmethod
    def load(cls, out_dir: Path) -> PhaseResult | None:
        """The result of a completed phase in `out_dir`, or None if it has not completed (or its `result.json` is
        not as it was written: then the phase runs again)."""
        path = out_dir / RESULT_FILE
        if not path.exists():
            return None
        try:
            data = unsealed_record(path.read_text())
        except ValueError as error:  # not written whole (by an older protorl), or changed since
            log.warning("%s cannot be read (%s): taking the phase as not complete", path, error)
            return None
        data.update(out_dir=out_dir, snapshots=[_inside(p, out_dir) for p in data["snapshots"]],
                    eval_rewards=[tuple(pair) for pair in data["eval_rewards"]])
        return cls(**data)

    def state_dict(self) -> dict:
        """Its entries of a checkpoint of the unfinished phase."""
        return {"episodes": self.episodes, "eval_rewards": [list(pair) for pair in self.eval_rewards],
                "snapshots": [_relative(p, self.out_dir) for p in self.snapshots]}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.episodes = int(checkpoint["episodes"])
        self.eval_rewards = [(int(f), float(r)) for f, r in checkpoint["eval_rewards"]]
        self.snapshots = [_inside(p, self.out_dir) for p in checkpoint["snapshots"]]


def _relative(path: Path, out_dir: Path) -> str:
    """`path` as written into the phase directory's own files: relative to `out_dir`."""
    return str(Path(path).relative_to(out_dir))


def _inside(path: str, out_dir: Path) -> Path:
    """A path read from the phase directory's own files; older absolute ones are taken by their place in it."""
    path = Path(path)
    return out_dir / (Path(*path.parts[-2:]) if path.is_absolute() else path)
