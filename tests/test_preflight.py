"""The pre-flight before a run writes anything: a replay buffer this machine cannot hold, and a run that would take
longer than `runtime.max_hours` here, are refused in one line, naming what to change."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys

import pytest
import torch

import protorl
from protorl.app import preflight as preflight_module
from protorl.app.exits import USER_ERROR_STATUS, exit_status
from protorl.app.preflight import TIMED_FROM_UPDATES, preflight
from protorl.config import ConfigError, TrainingConfig
from protorl.training import Trainer
from protorl.training.phases import planned_phases
from tests.agents import tiny, tiny_config
from tests.runs import STATES, assert_user_error, environment, read_csv, run

needs_meminfo = pytest.mark.skipif(not preflight_module._meminfo(),
                                   reason="the operating system does not report its memory")
ON_CPU = {"device": "cpu", "threads": 1}


def test_updates_fall_after_the_seed_steps_every_update_every_steps():
    training = TrainingConfig(seed_transitions=3, update_every_steps=2, updates_per_step=2)
    assert [training.updates_at(step) for step in range(8)] == [0, 0, 0, 0, 2, 0, 2, 0]
    assert TrainingConfig(seed_transitions=0).updates_at(0) == 0  # the replay is empty at the first step


def test_the_updates_counted_are_those_a_real_phase_makes(tmp_path):
    cfg = tiny(tmp_path, finetune_frames=3000, training={"update_every_steps": 2, "updates_per_step": 2})
    (phase,) = planned_phases(cfg, "finetune", snapshot_given=False)
    trainer = Trainer(cfg, phase, tmp_path / "finetune")
    trainer.run()
    assert len(read_csv(tmp_path / "finetune" / "eval.csv")[1]) > 0
    assert sum(map(cfg.training.updates_at, range(phase.frames // cfg.env.action_repeat))) == trainer.updates > 0


def test_a_run_longer_than_max_hours_is_refused_with_what_to_run_instead(tmp_path):
    frames = (TIMED_FROM_UPDATES + 2000) * 8  # action repeat 8: timed
    long = tiny(tmp_path / "run", pretrain_frames=frames, runtime={**ON_CPU, "max_hours": 1e-6})
    with pytest.raises(ConfigError, match=r"would take at least .* ms .*runtime\.max_hours=1e-06: .*protorl-train "
                                          r".*preset=small.*runtime\.max_hours=null"):
        protorl.pretrain(long)
    assert not (tmp_path / "run").exists()
    unlimited = tiny(tmp_path / "run", pretrain_frames=frames, runtime={**ON_CPU, "max_hours": None})
    assert preflight(unlimited, planned_phases(unlimited, "pretrain", snapshot_given=False)) > 0
    short = tiny(tmp_path / "run", runtime={**ON_CPU, "max_hours": 1e-6})
    assert preflight(short, planned_phases(short, "pretrain", snapshot_given=False)) is None  # not timed


def test_with_the_compiled_update_the_estimate_says_it_timed_the_update_uncompiled(tmp_path, caplog):
    """The compiled update is faster than the one timed: the estimate is then no lower bound, and says why."""
    frames = (TIMED_FROM_UPDATES + 2000) * 8  # action repeat 8: timed
    for compiled in (False, True):
        cfg = tiny(tmp_path / "run", pretrain_frames=frames,
                   runtime={**ON_CPU, "max_hours": None, "compile_update": compiled})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="protorl"):
            assert preflight(cfg, planned_phases(cfg, "pretrain", snapshot_given=False)) > 0
        (line,) = [record.getMessage() for record in caplog.records if "estimated wall time" in record.getMessage()]
        assert ("at least" in line) != compiled and ("uncompiled (runtime.compile_update" in line) == compiled, line


def test_a_continued_run_is_timed_from_its_newest_checkpoint(tmp_path, caplog):
    frames = 2 * (TIMED_FROM_UPDATES + 2000) * 8  # action repeat 8: half of it is still timed
    cfg = tiny(tmp_path / "run", pretrain_frames=frames, runtime={**ON_CPU, "max_hours": None})
    phases, steps = planned_phases(cfg, "pretrain", snapshot_given=False), frames // 8

    def estimate(config) -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="protorl"):
            preflight(config, phases)
        return caplog.text

    whole = f"pretrain: {sum(map(cfg.training.updates_at, range(steps)))} updates"
    assert whole in estimate(cfg)
    checkpoints = tmp_path / "run" / "pretrain" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for done in (frames // 4, frames // 2):
        (checkpoints / f"checkpoint_{done}.pt").touch()
    left = f"pretrain from frame {frames // 2}: {sum(map(cfg.training.updates_at, range(steps // 2, steps)))} " \
           f"updates at .* ms and {steps - steps // 2} agent steps"
    assert re.search(left, estimate(cfg))
    assert whole in estimate(dataclasses.replace(cfg, start_over=True))  # its directory is emptied first
    (tmp_path / "run" / "pretrain" / "result.json").touch()
    assert preflight(cfg, phases) is None  # nothing left to run: not timed


@needs_meminfo
def test_a_replay_this_machine_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="replay.capacity=1000000000000: the buffer would reserve"):
        protorl.pretrain(tiny(tmp_path / "b", replay={"capacity": 10**12}, runtime=ON_CPU))
    assert not any(tmp_path.iterdir())


def test_a_replay_larger_than_the_memory_available_now_is_refused(tmp_path, monkeypatch):
    """The frames a phase writes (twice where checkpoints copy them), against what the machine has free now."""
    pixels = dict(env={"obs": "pixels", "image_size": 32}, replay={"capacity": 100_000}, runtime=ON_CPU)
    cfg = tiny(tmp_path, pretrain_frames=8000, **pixels)  # 2001 slots of a 3x32x32 frame and more
    phases = planned_phases(cfg, "pretrain", snapshot_given=False)
    monkeypatch.setattr(preflight_module, "_meminfo", lambda: {"MemTotal": 2**40, "MemAvailable": 2001 * 3072})
    with pytest.raises(ConfigError, match=r"this run's replay would need about .* GiB \(pretrain\)"):
        preflight(cfg, phases)
    monkeypatch.setattr(preflight_module, "_meminfo", lambda: {"MemTotal": 2**40, "MemAvailable": 2**34})
    assert preflight(cfg, phases) is None


@pytest.mark.parametrize(("replay_on_device", "refused"), [(True, True), (None, False), (False, False)])
def test_on_a_gpu_the_replays_frames_must_fit_where_the_run_keeps_them(tmp_path, monkeypatch, replay_on_device,
                                                                       refused):
    """The frames go to the GPU with replay.on_device=true (then they must fit its free memory), and by default
    only when they take under half of it (as the training loop decides)."""
    cfg = tiny(tmp_path, runtime={"device": "cuda"}, env={"obs": "pixels", "image_size": 32},
               replay={"capacity": 500, "on_device": replay_on_device}, agent=tiny_config("proto"))
    frames = 500 * 3 * 32 * 32  # a uint8 RGB frame per slot (stacks are rebuilt)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (frames * 3 // 4, 80 * 2**30))
    phases = planned_phases(cfg, "pretrain", snapshot_given=False)
    if refused:
        with pytest.raises(ConfigError, match="replay's frames need .* GiB of cuda"):
            preflight(cfg, phases)
    else:
        preflight(cfg, phases)


def test_a_gpu_out_of_memory_ends_the_command_in_one_line():
    status, line = exit_status(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; ...)"))
    assert status == USER_ERROR_STATUS and "\n" not in line
    assert "out of memory" in line and "agent.batch_size" in line


@pytest.mark.slow
@needs_meminfo
def test_the_command_line_refuses_it_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    result = run("pretrain", *STATES, "replay.capacity=1000000000000", "pretrain_frames=1000", "runtime.device=cpu",
                 run_dir=run_dir)
    assert_user_error(result, "the buffer would reserve", "lower replay.capacity")
    assert not run_dir.exists()


def newcomer(command: str, cwd, timeout: float) -> subprocess.CompletedProcess:
    """`protorl-<command>` with no arguments, as a newcomer types it, in an empty directory, without a GPU."""
    return subprocess.run([sys.executable, "-c", f"from protorl.app.cli import {command}; {command}()"], cwd=cwd,
                          env={**environment(), "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_pretrain_without_arguments_says_it_would_take_days_and_what_finishes(tmp_path):
    """`protorl-pretrain` is the paper's 500k-frame pixel pre-training at batch 512: a CPU runs it in days. It is
    refused before it starts, with the estimate and the commands that finish in minutes."""
    try:
        result = newcomer("pretrain", tmp_path, timeout=400)
    except subprocess.TimeoutExpired:
        assert (tmp_path / "runs").is_dir(), "no refusal and no run within 400 s"
        pytest.skip("this machine's CPU runs the paper's pre-training within runtime.max_hours: it started")
    line = assert_user_error(result, "this run would take at least", "runtime.max_hours=24", "protorl-train",
                             "preset=small", "runtime.max_hours=null")
    assert " days " in line or " hours " in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_finetune_without_arguments_names_the_commands_that_make_a_snapshot(tmp_path):
    result = newcomer("finetune", tmp_path, timeout=150)
    assert_user_error(result, "snapshot=", "protorl-pretrain preset=small", "protorl-finetune preset=small",
                      "protorl-train")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("load", "threads", "busy"), [
    (1.0, 2, False),  # this process alone on 2 cores
    (1.6, 2, False),  # less than a core's worth of other work
    (3.0, 2, True),  # two other jobs: two threads would wait on each other
    (2.0, 1, False),  # one other job beside one thread
    (3.0, 1, True),
])
def test_the_cpu_is_busy_when_other_work_leaves_fewer_free_cores_than_threads(monkeypatch, load, threads, busy):
    monkeypatch.setattr(preflight_module.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(preflight_module.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert preflight_module._cpu_busy(threads) is busy


def test_where_the_load_is_unknown_the_cpu_counts_as_busy(monkeypatch):
    def unknown():
        raise OSError("no load average")

    monkeypatch.setattr(preflight_module.os, "getloadavg", unknown)
    assert preflight_module._cpu_busy(2)
