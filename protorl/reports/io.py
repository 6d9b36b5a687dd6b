"""Reading a run directory: its CSVs (keyed by environment frames) and the `result.json` of a completed phase."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from protorl.config import RENAMED_AGENTS
from protorl.errors import ResultsError
from protorl.plots import Rows
from protorl.storage.digests import unsealed_record
from protorl.storage.run_files import RESULT_FILE


def read_csv(path: Path) -> tuple[list[str], Rows]:
    """The columns of a run's CSV and its rows that have frames, their non-empty values as floats.

    A missing file, or one whose header never reached the disk, has no columns and no rows; a last row cut short
    (every row protorl writes ends with a newline) is not a row; a header without a frames column or a value that
    is not a number is a ResultsError naming the file."""
    if not path.is_file():
        return [], []
    with open(path, newline="") as f:
        text = f.read()
    if not text.endswith("\n"):  # a write cut short: its last line is not whole
        text = text[:text.rfind("\n") + 1]
    with io.StringIO(text, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if columns and "frames" not in columns:
            raise ResultsError(f"{path} has no frames column (its columns: {', '.join(columns)})")
        try:
            rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in reader]
        except ValueError as error:
            raise ResultsError(f"{path}, line {reader.line_num}: {error}") from error
    return columns, [row for row in rows if "frames" in row]


def read_result(phase: Path) -> dict | None:
    """The phase's `result.json`, written when it completed; None if it has none, or one not written whole or
    changed since (it does not match its digest)."""
    path = phase / RESULT_FILE
    if not path.is_file():
        return None
    try:
        return unsealed_record(path.read_text())
    except ValueError:  # as `PhaseResult.load`: a phase not known to be complete
        return None


# Runs started before `agent=proto` meant Proto-RL as published under every preset record the preset's files in
# `agent_preset@agent`: agent=proto under these files was the working variant (agent=proto_variant today)
_VARIANT_FILES_BEFORE_RENAME = {"proto_small", "proto_demo"}


def agent_choice(run_dir: Path, config: DictConfig) -> str:
    """The agent config a run was started with, by today's names (`agent=proto_variant` and `agent=proto` are both
    agent.name "proto"), from Hydra's record of the run; its agent.name if the run has none."""
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    choices = OmegaConf.load(hydra_file).hydra.runtime.choices if hydra_file.is_file() else {}
    choice = choices.get("agent")
    if "agent_preset@agent" in choices:  # started before the rename
        variant = choice == "proto" and choices["agent_preset@agent"] in _VARIANT_FILES_BEFORE_RENAME
        choice = "proto_variant" if variant else RENAMED_AGENTS.get(choice, choice)
    return str(choice or OmegaConf.select(config, "agent.name", default=""))
