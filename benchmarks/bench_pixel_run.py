"""Where a pixel run's time goes: a real `protorl-pretrain` timed by component, one job or several side by side.

Each job is the command itself (Hydra config, environment with rendering, replay, updates, analyses, checkpoints,
logs) in a fresh process, with timers wrapped around the parts of the training loop (exclusive times: rendering
inside a step counts as rendering, not physics; what an analysis renders or encodes counts as the analysis):

| component | what |
|---|---|
| render | MuJoCo's render of the observation camera (the training environment) |
| physics | the environment's step and reset without the render (physics, action repeat, frame stack) |
| acting | the policy's action for the next step (`Trainer._act`) |
| replay sampling | gathering a batch from the replay (`ReplayBuffer.sample`) |
| update | the agent's update on that batch |
| replay add | storing a step |
| analyses | coverage, maps, reward variance, state probe (`analyses.every_frames`) |
| checkpoints | writing the phase's checkpoints |
| snapshots, evaluation | their callbacks |
| logging | train.csv rows and the metrics' read-back (`ProgressLog`, `Trainer.check_finite`) |
| the rest | the phase's wall time minus all of the above (the loop's own Python, callbacks' per-step hooks) |

    python benchmarks/bench_pixel_run.py                                   # explore_pixels_long's settings, 2 jobs
    python benchmarks/bench_pixel_run.py --jobs 1
    python benchmarks/bench_pixel_run.py --overrides preset=small env.obs=pixels   # the small pixel preset
    python benchmarks/bench_pixel_run.py --vs /tmp/old                     # the same jobs on another checkout first

`--vs CHECKOUT` runs the same jobs with another checkout's protorl first (git worktree add /tmp/old <commit>), then
this one's, and prints both tables and the ratio of their env frames/s: a ratio from one run of the benchmark.
Each job writes its run into a temporary directory; `--frames` frames after the overrides (default 5000: 1000 seed
frames, then an update every agent step, and at the end one analysis and one checkpoint, the study's schedule of
one of each per 5000 frames). Env frames/s are given over the whole phase and over the frames after the seed steps
(what a long run converges to, its analyses and checkpoints included).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# the settings timed by default: the pixel exploration study's (experiment=explore_pixels_long), over fewer frames
DEFAULT_OVERRIDES = ["experiment=explore_pixels_long", "agent=proto", "runtime.threads=1",
                     "logging.progress_bar=false", "snapshots.at_frames=[]", "checkpoints.every_frames=5000",
                     "analyses.every_frames=5000"]
# (module, class, method, component); a method called inside another timed one counts as its own component,
# except inside the OPAQUE components, which keep everything they call
TIMED = [
    ("protorl.envs.dmc", "DMCEnv", "_frame", "render"),
    ("protorl.envs.dmc", "DMCEnv", "step", "physics"),
    ("protorl.envs.dmc", "DMCEnv", "reset", "physics"),
    ("protorl.training.loop", "Trainer", "_act", "acting"),
    ("protorl.replay", "ReplayBuffer", "sample", "replay sampling"),
    ("protorl.training.loop", "Trainer", "_update", "update"),
    ("protorl.replay", "ReplayBuffer", "add", "replay add"),
    ("protorl.replay", "ReplayBuffer", "add_first", "replay add"),
    ("protorl.training.callbacks.exploration", "AnalysisMonitor", "on_time_step", "analyses"),
    ("protorl.training.callbacks.exploration", "AnalysisMonitor", "on_episode_end", "analyses"),
    ("protorl.training.callbacks.exploration", "AnalysisMonitor", "on_phase_end", "analyses"),
    ("protorl.training.callbacks.checkpointing", "Checkpoints", "on_episode_end", "checkpoints"),
    ("protorl.training.callbacks.snapshotting", "Snapshots", "before_step", "snapshots"),
    ("protorl.training.callbacks.snapshotting", "Snapshots", "on_phase_end", "snapshots"),
    ("protorl.training.callbacks.evaluation", "Evaluation", "before_step", "evaluation"),
    ("protorl.training.callbacks.evaluation", "Evaluation", "on_phase_end", "evaluation"),
    ("protorl.training.callbacks.progress", "ProgressLog", "on_time_step", "logging"),
    ("protorl.training.callbacks.progress", "ProgressLog", "on_episode_end", "logging"),
    ("protorl.training.context", "PhaseContext", "check_finite", "logging"),
]
OPAQUE = {"analyses", "checkpoints", "snapshots", "evaluation", "logging"}
COMPONENTS = ["render", "physics", "acting", "replay sampling", "update", "replay add", "analyses", "checkpoints",
              "snapshots", "evaluation", "logging"]


class Timers:
    """Exclusive wall time per component, per thread (a step on the environment's own thread counts there)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.local = threading.local()
        self.lock = threading.Lock()

    def wrap(self, function, component: str):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            stack = self.local.__dict__.setdefault("stack", [])
            if stack and stack[-1][0] in OPAQUE:
                return function(*args, **kwargs)
            stack.append([component, 0.0])  # [component, seconds of timed calls inside it]
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                total = time.perf_counter() - start
                _, inner = stack.pop()
                if stack:
                    stack[-1][1] += total
                with self.lock:
                    self.seconds[component] = self.seconds.get(component, 0.0) + total - inner
                    self.calls[component] = self.calls.get(component, 0) + 1
        return timed


def _worker(overrides: list[str], out: Path) -> None:
    """Run protorl-pretrain with `overrides`, timed; write the figures as JSON to `out`."""
    import protorl
    from protorl.app.cli import pretrain

    timers = Timers()
    for module, cls, method, component in TIMED:
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, method, timers.wrap(getattr(owner, method), component))
    from protorl.training.loop import Trainer

    phase = {}
    run, update = Trainer.run, Trainer._update

    def timed_run(self):
        timers.seconds.clear(), timers.calls.clear()  # the phase only, not what building the Trainer did
        phase.update(seed_frames=self.cfg.training.seed_transitions * self.env.action_repeat, start=time.perf_counter())
        try:
            return run(self)
        finally:
            phase.update(wall=time.perf_counter() - phase["start"], frames=self.frames)

    def first_update(self):
        phase.setdefault("first_update", time.perf_counter() - phase["start"])
        phase.setdefault("first_update_frames", self.frames)
        return update(self)

    Trainer.run, Trainer._update = timed_run, first_update
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = ["protorl-pretrain", *overrides, f"hydra.run.dir={tmp}/run"]
        try:
            pretrain()
        except SystemExit as stop:
            if stop.code not in (None, 0):
                raise
    import torch

    out.write_text(json.dumps({"protorl": protorl.__file__, "torch_threads": torch.get_num_threads(),
                               "wall_s": phase["wall"], "frames": phase["frames"],
                               "seed_frames": phase["seed_frames"], "updating_s": phase["wall"] - phase["first_update"],
                               "updating_frames": phase["frames"] - phase["first_update_frames"],
                               "seconds": timers.seconds,
                               "calls": timers.calls}))


def run_jobs(overrides: list[str], jobs: int, checkout: Path | None) -> list[dict]:
    """`jobs` timed runs side by side (seeds 1, 2, ...), each in a fresh process; with `checkout`, importing that
    checkout's protorl (checked). The processes start outside any checkout, which would shadow PYTHONPATH."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    with tempfile.TemporaryDirectory() as tmp:
        processes, outs = [], []
        for job in range(jobs):
            out = Path(tmp) / f"job{job}.json"
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out), "--",
                       *overrides, f"seed={job + 1}"]
            processes.append(subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE, text=True))
            outs.append(out)
        results = []
        for process, out in zip(processes, outs, strict=True):
            _, stderr = process.communicate()
            if process.returncode != 0:
                sys.exit(f"a job failed (exit {process.returncode}):\n{stderr[-3000:]}")
            result = json.loads(out.read_text())
            if checkout is not None and not Path(result["protorl"]).resolve().is_relative_to(checkout.resolve()):
                sys.exit(f"imported {result['protorl']}, not the checkout {checkout}")
            results.append(result)
    return results


def fps(result: dict) -> float:
    """Env frames per second over the whole phase."""
    return result["frames"] / result["wall_s"]


def updating_fps(result: dict) -> float:
    """Env frames per second after the seed steps."""
    return result["updating_frames"] / result["updating_s"]


def print_table(title: str, results: list[dict]) -> None:
    """Seconds per component, share of the phase and ms per agent step, averaged over the jobs."""
    jobs = len(results)
    wall = sum(r["wall_s"] for r in results) / jobs
    frames = results[0]["frames"]
    steps = frames / 2  # action repeat 2 in every setting this benchmark times
    print(f"\n{title}: {jobs} job(s) side by side, {frames} frames each ({results[0]['seed_frames']} of them seed "
          f"frames), torch threads {results[0]['torch_threads']}")
    print("| component | s per job | share | ms per agent step | calls per job |")
    print("|---|---|---|---|---|")
    timed = 0.0
    for component in COMPONENTS:
        seconds = sum(r["seconds"].get(component, 0.0) for r in results) / jobs
        calls = sum(r["calls"].get(component, 0) for r in results) / jobs
        if calls == 0:
            continue
        timed += seconds
        print(f"| {component} | {seconds:.1f} | {seconds / wall:.1%} | {seconds / steps * 1e3:.1f} | {calls:.0f} |")
    rest = wall - timed
    print(f"| the rest | {rest:.1f} | {rest / wall:.1%} | {rest / steps * 1e3:.1f} | |")
    print(f"| **phase** | **{wall:.1f}** | 100% | {wall / steps * 1e3:.1f} | |")
    for name, rate in (("whole phase", fps), ("after the seed steps", updating_fps)):
        rates = ", ".join(f"{rate(r):.2f}" for r in results)
        print(f"env frames/s, {name}, per job: {rates} (mean {sum(map(rate, results)) / jobs:.2f}); all jobs "
              f"together {sum(map(rate, results)):.2f}")


def machine() -> str:
    """The CPU, its cores and hardware threads per core (two jobs on one core's two threads share its arithmetic)."""
    import platform

    import torch

    info = dict(line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout
                .splitlines() if ":" in line)
    model, per_core = (info.get(key, "?").strip() for key in ("Model name", "Thread(s) per core"))
    return (f"{model}, {os.cpu_count()} logical CPUs, {per_core} thread(s) per core; "
            f"Python {platform.python_version()}, torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side (seeds 1, 2, ...)")
    parser.add_argument("--frames", type=int, default=5000, help="pretrain_frames of each run")
    parser.add_argument("--overrides", nargs="*", default=None, metavar="KEY=VALUE",
                        help=f"protorl-pretrain overrides (default: {' '.join(DEFAULT_OVERRIDES)})")
    parser.add_argument("--vs", type=Path, help="another checkout, timed first with the same jobs")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        _worker([a for a in rest if a != "--"], args.worker)
        return
    overrides = (DEFAULT_OVERRIDES if args.overrides is None else args.overrides) + [f"pretrain_frames={args.frames}"]
    print(f"protorl-pretrain {' '.join(overrides)}")
    print(machine())
    if args.vs is not None:
        before = run_jobs(overrides, args.jobs, args.vs)
        print_table(f"other checkout ({args.vs})", before)
    after = run_jobs(overrides, args.jobs, None)
    print_table("this checkout", after)
    if args.vs is not None:
        for name, rate in (("whole phase", fps), ("after the seed steps", updating_fps)):
            ratio = sum(map(rate, after)) / sum(map(rate, before))
            print(f"env frames/s, {name}, this checkout / the other: {ratio:.3f}x")


if __name__ == "__main__":
    main()
