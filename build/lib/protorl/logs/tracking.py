"""Optional Weights & Biases tracking (`wandb=true`): the same metrics as the CSV and TensorBoard logs.

One W&B run per protorl run directory; each phase logs under its directory's name (`pretrain/`,
`finetune/`, `finetune_<task>/`) against its own frame counter (`<phase>/frames`). The W&B run id is kept
in `wandb_id.txt`, so re-running the command to resume continues the same W&B run. Off by default; the
`wandb` package is needed only when it is on (`pip install -e ".[wandb]"`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from protorl.config import LoggingConfig

ID_FILE = "wandb_id.txt"


def wandb_available() -> bool:
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    return True


def start_run(cfg: LoggingConfig, run_dir: Path, record: dict):
    """Start (or, with an id saved in `run_dir`, resume) the W&B run of `run_dir`, with the run's config `record`
    (plain data); None if `cfg.wandb` is off."""
    if not cfg.wandb:
        return None
    import wandb

    id_file = run_dir / ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    return wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity, group=cfg.wandb_group,
                      name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=record)


class PhaseTracker:
    """Sends one phase's scalars and images to the active W&B run, keyed by `<phase>/frames`."""

    def __init__(self, run, phase: str):
        self.run, self.phase = run, phase
        run.define_metric(f"{phase}/frames")
        run.define_metric(f"{phase}/*", step_metric=f"{phase}/frames")

    def log(self, scalars: dict[str, float], frames: int) -> None:
        self.run.log({**{f"{self.phase}/{tag}": value for tag, value in scalars.items()},
                      f"{self.phase}/frames": frames})

    def log_image(self, tag: str, image, frames: int) -> None:
        import wandb

        self.run.log({f"{self.phase}/{tag}": wandb.Image(image), f"{self.phase}/frames": frames})


def phase_tracker(run, phase: str) -> PhaseTracker | None:
    """A tracker for `phase` on the W&B run `start_run` returned, or None when there is none (wandb off)."""
    return None if run is None else PhaseTracker(run, phase)


def finish_run(run) -> None:
    if run is not None:
        run.finish()
