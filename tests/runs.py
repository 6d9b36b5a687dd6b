"""Helpers for tests that run protorl's console commands as subprocesses and read what they wrote.

Not a test module: tests import it (`from tests.runs import ...`) instead of importing each other.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# each agent's own sizes in a tiny run (the shared ones are in STATES and TINY)
AGENT_SIZES = {
    "proto": ["agent.num_prototypes=16", "agent.candidates_per_prototype=2", "agent.proj_dim=16",
              "agent.pred_hidden_dim=32"],
    "icm": ["agent.model_hidden_dim=32"],
    "apt": ["agent.knn_k=3"],  # APT's neighbours come from the batch of 8
}
# a tiny run from states: 1000-frame point_mass episodes of 125 agent steps (action repeat 8), a tiny agent
STATES_SHARED = [
    "env.obs=states", "preset=small", "task=point_mass_easy", "env.action_repeat=8", "training.seed_transitions=20",
    "replay.capacity=2000", "agent.batch_size=8", "agent.hidden_dim=32", "agent.feature_dim=16",
    "agent.state_hidden_dim=32", "evaluation.episodes=1", "evaluation.every_frames=1000",
    "analyses.every_frames=null", "snapshots.at_frames=[]", "logging.progress_bar=false", "runtime.threads=1",
]
STATES = [*STATES_SHARED, *AGENT_SIZES["proto"]]  # Proto-RL, the default agent
# a tiny run from pixels: 32x32 frames, action repeat 8 (125 agent steps per 1000-frame point_mass episode), a
# tiny agent, one intra-op thread: each subprocess takes seconds
TINY_SHARED = [
    "env.image_size=32", "env.action_repeat=8", "training.seed_transitions=20", "replay.capacity=500",
    "agent.batch_size=8", "agent.hidden_dim=32", "agent.feature_dim=16", "agent.state_hidden_dim=32",
    "evaluation.episodes=1", "evaluation.every_frames=1000", "logging.tensorboard=false",
    "logging.progress_bar=false", "runtime.threads=1",
]
TINY = [*TINY_SHARED, *AGENT_SIZES["proto"]]  # Proto-RL, the default agent


def tiny_agent(name: str) -> list[str]:
    """`agent=name` and that agent's own tiny sizes, to follow STATES_SHARED or TINY_SHARED."""
    return [f"agent={name}", *AGENT_SIZES.get(name, [])]


TIMEOUT_S = 150
TIMING_COLUMNS = {"fps", "total_time_s", "analysis/time_s"}


def command_line(command: str, *overrides: str, run_dir: Path) -> list[str]:
    """`protorl-<command>` (through its console-script function) with Hydra overrides, in `run_dir`."""
    module = "protorl.app.tools" if command in ("tasks", "analyze", "probe", "aggregate") else "protorl.app.cli"
    return [sys.executable, "-c", f"from {module} import {command}; {command}()", *overrides,
            f"hydra.run.dir={run_dir}"]


def environment() -> dict[str, str]:
    return {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}


def run(command: str, *overrides: str, run_dir: Path, **popen) -> subprocess.CompletedProcess:
    """Run a command to its end; its output captured."""
    return subprocess.run(command_line(command, *overrides, run_dir=run_dir), capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=environment(), cwd=run_dir.parent, **popen)


def start(command: str, *overrides: str, run_dir: Path, output: bool = False) -> subprocess.Popen:
    """Start a command in the background, its output discarded, or kept for `communicate()` with `output`. Ctrl-C
    (SIGINT) reaches it as it reaches a command typed in a terminal, also where the tests themselves were started
    in the background by a shell, which ignores SIGINT for them and their children."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    stream = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen(command_line(command, *overrides, run_dir=run_dir), env=environment(),
                            cwd=run_dir.parent, stdout=stream, stderr=stream, text=output,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit status 2 with one `protorl: error:` line (the last of stderr) holding every fragment; returns it."""
    assert result.returncode == 2, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    errors = [line for line in result.stderr.splitlines() if "protorl: error:" in line]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def assert_finite_floats(row: dict[str, str], keys) -> None:
    """Each of `keys` in a CSV row holds a finite number (not empty, not nan, not inf)."""
    for key in keys:
        assert row[key] != "", (key, row)
        assert math.isfinite(float(row[key])), (key, row[key])


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """A CSV's header and rows."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def csv_rows(path: Path) -> int:
    """The complete data rows of a CSV that a running process may be writing: the file is read once, and a line
    not yet ended is not counted (parsing a file as it grows can see it empty, then its header)."""
    if not path.is_file():
        return 0
    return max(path.read_text().count("\n") - 1, 0)


def read_rows(path: Path) -> list[dict[str, str]]:
    """A CSV's rows without its wall-time columns."""
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in read_csv(path)[1]]


def tree(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Relative path -> content hash of every file under `root` (links by target), except under `skip`."""
    found = {}
    for path in sorted(root.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        if path.is_symlink():
            found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha1(path.read_bytes()).hexdigest()
    return found


def tensorboard_scalars(log_dir: Path) -> list[tuple[str, int, float]]:
    """Every scalar event in every events file under `log_dir`, wall-time tags left out, sorted."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    scalars = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag.split("/")[-1] in {"fps", "total_time_s", "time_s"}:
                    continue
                number = value.simple_value if value.HasField("simple_value") else \
                    float(value.tensor.float_val[0]) if value.tensor.float_val else None
                if number is not None:
                    scalars.append((value.tag, int(event.step), float(number)))
    return sorted(scalars)


def wait_for_rows(process, train_csv: Path, rows: int, timeout_s: float = 150) -> None:
    """Until the running `process` has logged `rows` episodes to `train_csv`."""
    deadline = time.time() + timeout_s
    while csv_rows(train_csv) < rows:
        assert process.poll() is None, f"the run ended before episode {rows}"
        assert time.time() < deadline, f"no episode {rows} within {timeout_s:.0f} s"
        time.sleep(0.01)
