"""Chaos soak: a small sweep run again and again while its processes are stopped at random moments, until it
completes; then every run's logs, results and snapshot tensors compared with an undisturbed sweep of the same
settings. Nothing may be lost, duplicated or changed by a fault: the aim is zero differences.

    python tools/chaos_soak.py --minutes 30             # rounds of chaos until 30 minutes have passed
    python tools/chaos_soak.py --rounds 1 --jobs 4      # one quick round

The sweep is `protorl-train -m seed=0,...` (tiny Proto-RL runs from states: pre-training with a snapshot, then
fine-tuning, checkpoints every episode), `--jobs` jobs two at a time on Hydra's joblib launcher, one thread each.
The faults, at random moments (up to 12 a round, then the sweep runs undisturbed to its end):
- `kill-job`: SIGKILL one process of the sweep other than its launcher (a job's worker, or the resource tracker
  of Python's multiprocessing);
- `kill-sweep`: SIGKILL every process of the sweep at once (a machine that loses its processes);
- `ctrl-c`: SIGINT to every process of the sweep, as Ctrl-C in its terminal;
- `full-disk`: the disk of the sweep's directory full for 0.5-5 s (a tmpfs of `--disk-mib` MiB filled by a
  ballast file; needs the right to mount, as root: otherwise this fault is left out and the summary says so).
After each attempt the same sweep command is run again in the same directory, until one attempt exits 0 with
every phase's `result.json` written. A round then compares, run by run: every CSV row (wall-time columns left
out), `result.json` (wall time, run directory and digests left out), every snapshot's tensors and values
bitwise, TensorBoard's scalars; and checks that no temporary file is left. It prints each round's faults,
attempts and exit statuses, then the totals, and keeps the output of each attempt that printed a traceback (in
`<work dir>/logs`). Exit status 1 if any difference was found.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# tiny Proto-RL runs from states: 1000-frame point_mass episodes of 125 agent steps, a checkpoint at every episode
# end, a snapshot part way through the pre-training and one at its end
SETTINGS = [
    "env.obs=states", "preset=small", "task=point_mass_easy", "env.action_repeat=8", "training.seed_transitions=20",
    "replay.capacity=2000", "agent.batch_size=8", "agent.hidden_dim=32", "agent.feature_dim=16",
    "agent.state_hidden_dim=32", "agent.num_prototypes=16", "agent.candidates_per_prototype=2", "agent.proj_dim=16",
    "agent.pred_hidden_dim=32", "evaluation.episodes=1", "evaluation.every_frames=1000",
    "analyses.every_frames=null", "pretrain_frames=4000", "finetune_frames=3000", "snapshots.at_frames=[2000]",
    "checkpoints.every_frames=1000", "checkpoints.keep=2", "logging.progress_bar=false", "runtime.threads=1",
]
FAULTS = ("kill-job", "kill-sweep", "ctrl-c", "full-disk")
TIMING_COLUMNS = {"fps", "total_time_s", "analysis/time_s"}  # wall time: differs between any two runs
# what two runs of the same settings in two directories write differently: wall time, their own directory, and
# digests of content holding either (snapshots are compared tensor by tensor instead)
OWN_KEYS = {"wall_time_s", "run_dir", "sha256", "snapshot_digests"}
HANG_S = 300  # an attempt still running this long after its fault has hung: it is killed and counted


def sweep_command(sweep_dir: Path, jobs: int) -> list[str]:
    """`protorl-train -m` over seeds 0..jobs-1, two jobs at a time, into `sweep_dir`."""
    seeds = ",".join(str(seed) for seed in range(jobs))
    return [sys.executable, "-c", "from protorl.app.cli import train; train()", "-m", *SETTINGS, f"seed={seeds}",
            "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}"]


def start_sweep(sweep_dir: Path, jobs: int, log) -> subprocess.Popen:
    """The sweep in a process group of its own, its output written to the file `log`."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(sweep_command(sweep_dir, jobs), stdout=log, stderr=log, env=env, cwd=sweep_dir.parent,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid` (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


class Disk:
    """A tmpfs of `mib` MiB mounted at `path`, filled for a moment by `fill`; `None` from `mount` where this
    process may not mount one."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def mount(cls, path: Path, mib: int) -> Disk | None:
        path.mkdir(parents=True, exist_ok=True)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                                 capture_output=True)
        return cls(path) if mounted.returncode == 0 else None

    def fill(self, seconds: float) -> None:
        """Write a ballast file until the disk is full, hold it `seconds`, delete it."""
        ballast = self.path / "ballast"
        block = b"\0" * (1 << 20)
        try:
            with open(ballast, "wb") as file:
                try:
                    while True:
                        file.write(block)
                        file.flush()
                except OSError:  # full
                    pass
                for size in (1 << 16, 1 << 12, 1):  # the last bytes too
                    try:
                        while True:
                            file.write(block[:size])
                            file.flush()
                    except OSError:
                        pass
                time.sleep(seconds)
        except OSError:
            pass
        finally:
            ballast.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", str(self.path)], capture_output=True)


def wait_for(process: subprocess.Popen, seconds: float) -> int | None:
    """The process's exit status if it ends within `seconds`, else None."""
    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def complete(sweep_dir: Path, jobs: int) -> bool:
    """Every job's pre-training and fine-tuning wrote its result."""
    return sum(1 for _ in sweep_dir.glob("*/*/result.json")) == 2 * jobs


def inject(kind: str, process: subprocess.Popen, rng: random.Random, disk: Disk | None) -> None:
    """One fault of `kind` to the running sweep `process`."""
    if kind == "kill-job":
        workers = [pid for pid in group_pids(process.pid) if pid != process.pid]
        for pid in rng.sample(workers, 1) if workers else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elif kind == "kill-sweep":
        signal_group(process.pid, signal.SIGKILL)
    elif kind == "ctrl-c":
        signal_group(process.pid, signal.SIGINT)
    else:
        disk.fill(rng.uniform(0.5, 5.0))


def chaos_round(sweep_dir: Path, jobs: int, rng: random.Random, undisturbed_s: float, disk: Disk | None,
                logs: Path, max_faults: int = 12) -> dict:
    """Run the sweep in `sweep_dir` until it completes, with faults at random moments while fewer than
    `max_faults` were injected (then it runs undisturbed); what happened, counted. Each attempt's output goes to a
    file in `logs`."""
    kinds = [kind for kind in FAULTS if kind != "full-disk" or disk is not None]
    faults, statuses = collections.Counter(), collections.Counter()
    hangs = attempts = tracebacks = 0
    while True:
        attempts += 1
        log_path = logs / f"{sweep_dir.name}_attempt{attempts}.log"
        with open(log_path, "wb") as log:
            process = start_sweep(sweep_dir, jobs, log)
            status = None
            while status is None and sum(faults.values()) < max_faults:
                status = wait_for(process, rng.uniform(1.0, undisturbed_s / 2))
                if status is None:
                    kind = rng.choice(kinds)
                    faults[kind] += 1
                    inject(kind, process, rng, disk)
                    if kind != "full-disk":
                        break
            if status is None:
                status = wait_for(process, HANG_S)
            if status is None:
                hangs += 1
                signal_group(process.pid, signal.SIGKILL)
                status = process.wait()
            signal_group(process.pid, signal.SIGKILL)  # what a killed launcher left behind (joblib's workers)
        statuses[status] += 1
        if "Traceback" in log_path.read_text(errors="replace"):
            tracebacks += 1
        else:
            log_path.unlink()  # kept: the logs of the attempts that printed a traceback
        if status == 0 and complete(sweep_dir, jobs):
            return {"attempts": attempts, "faults": faults, "statuses": statuses, "hangs": hangs,
                    "tracebacks": tracebacks}


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in csv.DictReader(file)]


def without_own_keys(value):
    """`value` with the keys of `OWN_KEYS` left out, at any depth."""
    if isinstance(value, dict):
        return {k: without_own_keys(v) for k, v in value.items() if k not in OWN_KEYS}
    return value


def same_values(a, b) -> bool:
    """Nested dicts/lists/tensors equal, tensors bit for bit (dtype and shape too)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def scalars(tb_dir: Path) -> list[tuple[str, int, float]]:
    """TensorBoard's scalars under `tb_dir`, wall-time tags left out, sorted."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag.split("/")[-1] in {"fps", "total_time_s", "time_s"}:
                    continue
                if value.HasField("simple_value"):
                    found.append((value.tag, int(event.step), float(value.simple_value)))
                elif value.tensor.float_val:
                    found.append((value.tag, int(event.step), float(value.tensor.float_val[0])))
    return sorted(found)


def compare_sweeps(reference: Path, chaos: Path) -> tuple[int, list[str]]:
    """Files compared, and a line per difference: every data file of each run of `reference` against the same
    file of `chaos`; temporary files left in `chaos`."""
    compared, differences = 0, []
    for ref_run in sorted(p for p in reference.iterdir() if (p / "config.yaml").is_file()):
        run = chaos / ref_run.name
        for ref_file in sorted(ref_run.rglob("*")):
            relative = ref_file.relative_to(reference)
            other = chaos / relative
            if ref_file.suffix == ".csv":
                same = other.is_file() and csv_rows(ref_file) == csv_rows(other)
            elif ref_file.name == "result.json":
                same = other.is_file() and (without_own_keys(json.loads(ref_file.read_text()))
                                            == without_own_keys(json.loads(other.read_text())))
            elif ref_file.suffix == ".pt" and ref_file.parent.name == "snapshots":
                same = other.is_file() and same_values(without_own_keys(torch.load(ref_file, weights_only=True)),
                                                       without_own_keys(torch.load(other, weights_only=True)))
            elif ref_file.name == "tb":
                same = other.is_dir() and scalars(ref_file) == scalars(other)
            else:
                continue
            compared += 1
            if not same:
                differences.append(f"{relative}: {'missing' if not other.exists() else 'differs'}")
        differences += [f"{p.relative_to(chaos)}: a temporary file left" for p in run.rglob("*.tmp")]
    return compared, differences


def soak(work: Path, jobs: int, rounds: int | None, minutes: float, seed: int, disk_mib: int,
         keep: bool = False, echo=print) -> collections.Counter:
    """The undisturbed sweep in `work`/reference, then chaos rounds (`rounds` of them, or until `minutes` have
    passed) each compared with it; each round's line to `echo`; the totals."""
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    rng = random.Random(seed)
    disk = Disk.mount(work / "disk", disk_mib)
    if disk is None:
        echo("could not mount a tmpfs (mounting needs root): the full-disk fault is left out")
    totals = collections.Counter()
    try:
        start = time.time()
        reference = work / "reference"
        if not complete(reference, jobs):
            with open(logs / "reference.log", "wb") as log:
                status = start_sweep(reference, jobs, log).wait()
            if status != 0 or not complete(reference, jobs):
                raise RuntimeError(f"the undisturbed sweep failed (exit status {status}): see {logs / 'reference.log'}")
        undisturbed_s = time.time() - start
        echo(f"undisturbed sweep: {jobs} jobs in {undisturbed_s:.0f} s")
        deadline = start + 60 * minutes
        while (totals["rounds"] < rounds) if rounds is not None else (time.time() < deadline):
            totals["rounds"] += 1
            chaos = (disk.path if disk else work) / f"chaos_{totals['rounds']}"
            began = time.time()
            outcome = chaos_round(chaos, jobs, rng, undisturbed_s, disk, logs)
            compared, differences = compare_sweeps(reference, chaos)
            totals.update({f"fault {kind}": n for kind, n in outcome["faults"].items()})
            totals.update({f"exit status {status}": n for status, n in outcome["statuses"].items()})
            totals.update(attempts=outcome["attempts"], hangs=outcome["hangs"], tracebacks=outcome["tracebacks"],
                          compared=compared, differences=len(differences))
            echo(f"round {totals['rounds']}: {outcome['attempts']} attempts in {time.time() - began:.0f} s, "
                 f"faults {dict(outcome['faults'])}, exit statuses {dict(outcome['statuses'])}, "
                 f"{outcome['tracebacks']} attempts printed a traceback, hung {outcome['hangs']}; "
                 f"{compared} files compared, {len(differences)} differences")
            for line in differences:
                echo("  " + line)
            if differences or keep:
                shutil.copytree(chaos, work / f"kept_{chaos.name}", dirs_exist_ok=True)
            shutil.rmtree(chaos)
        totals["minutes"] = round((time.time() - start) / 60, 1)
    finally:
        if disk is not None:
            disk.unmount()
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="start rounds until this much time has passed")
    parser.add_argument("--rounds", type=int, default=None, help="this many rounds instead")
    parser.add_argument("--jobs", type=int, default=8, help="jobs in the sweep (seeds 0..jobs-1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    parser.add_argument("--disk-mib", type=int, default=256, help="size of the tmpfs the chaos sweeps run on")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the sweeps go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the sweeps' directories")
    args = parser.parse_args()

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="protorl-chaos-")).resolve()
    totals = soak(work, args.jobs, args.rounds, args.minutes, args.seed, args.disk_mib, args.keep,
                  echo=lambda line: print(line, flush=True))
    faults = {key[6:]: n for key, n in totals.items() if key.startswith("fault ")}
    statuses = {key[12:]: n for key, n in totals.items() if key.startswith("exit status ")}
    print(f"total: {totals['rounds']} rounds in {totals['minutes']} min, {sum(faults.values())} faults {faults}, "
          f"{totals['attempts']} attempts, exit statuses {statuses}, {totals['tracebacks']} attempts printed a "
          f"traceback, hung {totals['hangs']}; {totals['compared']} files compared, "
          f"{totals['differences']} differences")
    if args.keep or totals["differences"] or totals["tracebacks"]:
        print(f"sweeps and the logs of the attempts that printed a traceback kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if totals["differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
