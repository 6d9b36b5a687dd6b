"""Metrics to CSV files (`train.csv`, `eval.csv`) and TensorBoard, keyed by environment frames."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

# train.csv's first columns; the agent's update metrics follow. episode_success: 1 if any step of the episode
# had a positive reward (the success of a sparse task), else 0; success_rate: the evaluation episodes' mean of it
EPISODE_COLUMNS = ["frames", "agent_steps", "episode", "episode_reward", "episode_length_frames", "fps",
                   "total_time_s", "episode_success"]
EVAL_COLUMNS = ["frames", "agent_steps", "episode_reward", "episode_reward_std", "episodes", "total_time_s",
                "success_rate"]


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An `OSError` raised inside that names no file (a write that fails when a file is flushed, e.g. on a full
    disk) is raised again naming `path`."""
    try:
        yield
    except OSError as error:
        if error.filename:
            raise
        raise OSError(error.errno, error.strerror or str(error), str(path)) from error


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread raises a failed write (a full disk, a read-only directory) in the thread, which
    prints its traceback, and again in the run, which reports it in one line: keep the thread's traceback off
    stderr. Every other thread's error goes to the hook there was."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not (issubclass(args.exc_type, OSError) and type(args.thread).__module__.startswith("tensorboard.")):
            previous(args)

    hook.quiets_tensorboard = True
    threading.excepthook = hook


class CSVFile:
    """Append-only CSV with a fixed header; missing values are left empty, a value without a column is an error."""

    def __init__(self, path: Path, columns: list[str]):
        self.path, self.columns = path, columns
        new = not path.exists()
        self._file = open(path, "a", newline="")  # noqa: SIM115 - closed by Logger.close
        self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="raise", restval="")
        if new:
            self._writer.writeheader()

    def tell(self) -> int:
        """Bytes written so far; `truncate` to it drops the rows written after."""
        return self._file.tell()

    def truncate(self, size: int) -> None:
        """Cut the file back to `size` bytes; a file already shorter (its tail lost in a crash) is kept as is."""
        with naming(self.path):
            size = min(size, os.fstat(self._file.fileno()).st_size)
            self._file.truncate(size)
            self._file.seek(size)

    def sync(self) -> None:
        """Flush to the disk: what a checkpoint records as written is on the disk before the checkpoint."""
        with naming(self.path):
            self._file.flush()
            os.fsync(self._file.fileno())

    def reset(self) -> None:
        """Drop every row: the header alone remains."""
        self.truncate(0)
        with naming(self.path):
            self._writer.writeheader()
            self._file.flush()

    def write(self, row: dict) -> None:
        with naming(self.path):
            self._writer.writerow(row)
            self._file.flush()

    def close(self) -> None:
        with naming(self.path):
            self._file.close()


class Logger:
    """Averages update metrics between episode ends; writes one train row per episode, one per eval.

    Update metrics may be 0-d tensors on an accelerator: `accumulate` keeps them there, and they are read back
    in one transfer when a row is written or `flush` is called, so updates do not wait for the host.
    """

    def __init__(self, log_dir: Path, metrics: Sequence[str], tensorboard: bool = True, tracker=None):
        """`metrics`: the names of the update metrics (`Agent.metric_names()`), train.csv's columns after
        `EPISODE_COLUMNS`; `tracker`: a `protorl.logs.tracking.PhaseTracker` that also receives every scalar and
        image."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.train_csv = CSVFile(log_dir / "train.csv", [*EPISODE_COLUMNS, *metrics])
        self.eval_csv = CSVFile(log_dir / "eval.csv", EVAL_COLUMNS)
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self._pending: list[dict[str, torch.Tensor | float]] = []  # update metrics not yet read back
        self._tb = None  # opened at the first scalar or image: its events file starts where the run does
        self._tb_file: Path | None = None  # the events file it writes, named in a failed write's error
        self._tb_dir = log_dir / "tb" if tensorboard else None
        self._tracker = tracker

    @property
    def _writer(self):
        if self._tb is None and self._tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_thread()
            with naming(self._tb_dir):
                self._tb = SummaryWriter(log_dir=str(self._tb_dir))
            self._tb_file = (self._events_files() or [self._tb_dir])[-1]  # its own, newest: named after its start
        return self._tb

    def _events_files(self) -> list[Path]:
        return sorted(self._tb_dir.glob("events.out.tfevents.*")) if self._tb_dir and self._tb_dir.is_dir() else []

    def state_dict(self, frames: int) -> dict:
        """Where the files stand and the metrics not yet written, at `frames`."""
        self.flush()
        if self._tb is not None:
            with naming(self._tb_file):
                self._tb.flush()
        for path in self._events_files():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        self.train_csv.sync()
        self.eval_csv.sync()
        return {"train_csv": self.train_csv.tell(), "eval_csv": self.eval_csv.tell(), "frames": frames,
                "tensorboard": {path.name: path.stat().st_size for path in self._events_files()},
                "sums": dict(self._sums), "counts": dict(self._counts)}

    def load_state_dict(self, state: dict) -> None:
        """Drop what was logged after the checkpoint, so a resumed run neither repeats nor loses a point: the
        CSVs and TensorBoard's events files are cut back to where they stood."""
        self.train_csv.truncate(state["train_csv"])
        self.eval_csv.truncate(state["eval_csv"])
        self._sums.clear()
        self._sums.update(state["sums"])
        self._counts.clear()
        self._counts.update(state["counts"])
        self._pending.clear()
        self._cut_tensorboard(state["tensorboard"])

    def reset(self) -> None:
        """Start the logs afresh: drop whatever an earlier attempt of this phase logged without a checkpoint."""
        self.train_csv.reset()
        self.eval_csv.reset()
        self._cut_tensorboard({})

    def _cut_tensorboard(self, sizes: dict[str, int]) -> None:
        """Events files listed in `sizes` are truncated to their size, every other one deleted."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        for path in self._events_files():
            if path.name in sizes:
                with open(path, "r+b") as f:
                    f.truncate(min(sizes[path.name], os.fstat(f.fileno()).st_size))
            else:
                path.unlink()

    def accumulate(self, metrics: dict[str, torch.Tensor | float]) -> None:
        """Add one update's metrics (numbers or 0-d tensors) to the next row's averages."""
        self._pending.append(metrics)

    def flush(self) -> dict[str, float]:
        """Read the pending update metrics back to the host (one transfer per dtype) into the running sums.

        Returns the non-finite ones: metric -> its first non-finite value since the last flush."""
        if not self._pending:
            return {}
        tensors = [v for metrics in self._pending for v in metrics.values() if isinstance(v, torch.Tensor)]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
        for tensor in tensors:
            by_dtype[tensor.dtype].append(tensor.reshape(()))
        values = {dtype: iter(torch.stack(group).tolist()) for dtype, group in by_dtype.items()}
        bad: dict[str, float] = {}
        for metrics in self._pending:
            for key, value in metrics.items():
                value = next(values[value.dtype]) if isinstance(value, torch.Tensor) else float(value)
                if not math.isfinite(value):
                    bad.setdefault(key, value)
                self._sums[key] += value
                self._counts[key] += 1
        self._pending.clear()
        return bad

    def log_train(self, row: dict) -> dict:
        """Write an episode row merged with the update metrics averaged since the last row."""
        self.flush()
        row = dict(row)
        row.update({key: self._sums[key] / self._counts[key] for key in self._sums})
        self._sums.clear()
        self._counts.clear()
        self.train_csv.write(row)
        self._publish("train", row)
        return row

    def log_eval(self, row: dict) -> None:
        self.eval_csv.write(row)
        self._publish("eval", row)

    def log_scalars(self, row: dict) -> None:
        """TensorBoard (and W&B) only: each value of `row` under its own key as tag (e.g.
        `coverage/entropy`), at `row["frames"]`; for analyses that keep their own CSV."""
        self._publish("", row)

    def log_image(self, tag: str, image: np.ndarray, frames: int) -> None:
        """TensorBoard (and W&B) only: an RGB (H, W, 3) uint8 image at `frames`."""
        if self._writer is not None:
            with naming(self._tb_file):
                self._writer.add_image(tag, image, global_step=frames, dataformats="HWC")
                self._writer.flush()
        if self._tracker is not None:
            self._tracker.log_image(tag, image, frames)

    def _publish(self, prefix: str, row: dict) -> None:
        """The finite numbers of `row` to TensorBoard and the tracker, tagged `prefix/key`."""
        scalars = {f"{prefix}/{key}" if prefix else key: value for key, value in row.items()
                   if key != "frames" and isinstance(value, (int, float)) and math.isfinite(value)}
        if self._writer is not None:
            with naming(self._tb_file):
                for tag, value in scalars.items():
                    self._writer.add_scalar(tag, value, global_step=row["frames"])
                self._writer.flush()
        if self._tracker is not None:
            self._tracker.log(scalars, row["frames"])

    def close(self) -> None:
        self.train_csv.close()
        self.eval_csv.close()
        if self._tb is not None:
            with naming(self._tb_file):
                self._tb.close()
