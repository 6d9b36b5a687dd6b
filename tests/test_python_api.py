"""protorl.train / pretrain / finetune from Python: the commands' checks and run-directory contract."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import protorl
from protorl.agents.proto.agent import ProtoConfig
from protorl.app.plan import configured
from protorl.config import Config, ConfigError, TrainingConfig
from protorl.envs import DMCEnv
from protorl.errors import SnapshotError
from protorl.runtime import prepare_process
from protorl.training import Trainer, phase_of
from protorl.training.rng_state import capture_rngs, restore_rngs
from tests.agents import tiny, tiny_config
from tests.runs import read_csv, read_rows


@pytest.mark.slow
def test_train_runs_both_phases_and_keeps_the_run_directory_contract(tmp_path):
    run_dir = tmp_path / "run"
    results = protorl.train(tiny(run_dir))
    assert [(r.phase, r.frames) for r in results] == [("pretrain", 1000), ("finetune", 1000)]
    assert results[0].snapshots and results[0].snapshots[-1].is_file()
    _, evals = read_csv(run_dir / "finetune" / "eval.csv")
    assert [r["frames"] for r in evals] == ["0", "1000"]
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.agent.num_prototypes == 16 and saved.run_dir == str(run_dir)
    # the same call again: both phases are complete, nothing runs again
    again = protorl.train(tiny(run_dir))
    assert [(r.phase, r.wall_time_s) for r in again] == [(r.phase, r.wall_time_s) for r in results]
    # other settings in the same directory are refused, naming the key
    with pytest.raises(ConfigError, match="finetune_frames"):
        protorl.train(tiny(run_dir), finetune_frames=2000)
    # fine-tuning from the snapshot on another task of the domain, as protorl-finetune
    other = protorl.finetune(tiny(tmp_path / "other", task="point_mass_hard"), snapshot=str(results[0].snapshots[-1]))
    assert [(r.phase, r.task) for r in other] == [("finetune", "point_mass_hard")]


def test_bad_input_raises_one_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key bogus"):
        protorl.train(tiny(tmp_path / "a"), bogus=1)
    with pytest.raises(ConfigError, match="config='x': expected a protorl.config.Config"):
        protorl.train("x", run_dir=str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="run_dir is required"):
        protorl.pretrain(dataclasses.replace(Config(), agent=ProtoConfig()))
    with pytest.raises(ConfigError, match="agent.knn_k"):
        protorl.pretrain(tiny(tmp_path / "b", agent=tiny_config("proto", knn_k=0)))
    with pytest.raises(SnapshotError, match="no such file"):
        protorl.finetune(tiny(tmp_path / "c"), snapshot=str(tmp_path / "missing.pt"))
    maze = tiny(tmp_path / "d", pretrain_task="point_mass_maze_explore",
                finetune_tasks=["point_mass_maze_reach_top_left"])
    with pytest.raises(ConfigError, match="task=walker_run is not a task of this run"):
        protorl.train(maze, task="walker_run")  # the config's tasks would run, not walker_run
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("same_directory", [True, False])
def test_a_second_run_from_another_thread_is_refused(tmp_path, same_directory):
    """One run at a time per process: runs draw from the process-wide random generators, so a second one started
    from another thread while the first runs (in its directory or another) is refused, and the first completes with
    each train.csv row once and the numbers it has alone."""
    run_dir, results = tmp_path / "run", []
    first = threading.Thread(target=lambda: results.append(protorl.pretrain(tiny(run_dir, pretrain_frames=8000))))
    first.start()
    while first.is_alive() and not (run_dir / "config.yaml").exists():  # written once the directory is claimed
        time.sleep(0.01)
    with pytest.raises(ConfigError, match="another protorl run is in progress in this process"):
        protorl.pretrain(tiny(run_dir if same_directory else tmp_path / "other", pretrain_frames=8000))
    first.join()
    frames = [row["frames"] for row in read_csv(run_dir / "pretrain" / "train.csv")[1]]
    assert results and len(frames) == len(set(frames)) == 8
    assert not (tmp_path / "other").exists()
    alone = tmp_path / "alone"
    protorl.pretrain(tiny(alone, pretrain_frames=8000))
    assert read_rows(run_dir / "pretrain" / "train.csv") == read_rows(alone / "pretrain" / "train.csv")


@pytest.mark.slow
def test_a_finished_trainer_is_freed_without_the_garbage_collector(tmp_path):
    """A phase's Trainer (its replay, agent and optimisers) goes when the phase is done, not at the garbage
    collector's next pass: on a GPU the next phase needs that memory."""
    config = tiny(tmp_path / "run")
    prepare_process(config.runtime)
    phase = phase_of(config, "pretrain", "point_mass_easy")
    Trainer(config, phase, tmp_path / "first").run()  # torch's one-time set-up
    gc.collect()
    gc.disable()
    try:
        trainer = Trainer(config, phase, tmp_path / "second")
        alive = weakref.ref(trainer)
        trainer.run()
        del trainer
        assert alive() is None
    finally:
        gc.enable()


def test_the_random_state_holds_each_cuda_generator_where_there_is_cuda(monkeypatch):
    """By construction: where CUDA is available, a checkpoint's random state holds every device's generator and a
    resume sets them back."""
    states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.extend)
    env = DMCEnv("point_mass_easy", obs="states")
    state = capture_rngs(np.random.default_rng(0), env, env)
    assert state["cuda"] is states
    restore_rngs(state, np.random.default_rng(0), env, env)
    assert restored == states


@pytest.mark.parametrize(("fields", "message"), [
    ({"seed": 1.5}, "seed: Value '1.5' of type 'float' could not be converted to Integer"),
    ({"seed": True}, "seed: Value 'True' of type 'bool' could not be converted to Integer"),
    ({"pretrain_frames": 2000.5}, "pretrain_frames: Value '2000.5'"),
    ({"seed": "three"}, "seed: Value 'three' of type 'str' could not be converted to Integer"),
    ({"task": None}, "task: Incompatible value 'None' for field of type 'str'"),
    ({"finetune_tasks": "walker_walk"}, "finetune_tasks: "),
    ({"checkpoints": {"every_frames": "often"}}, "checkpoints.every_frames: Value 'often'"),
    ({"env": {"image_size": 32.5}}, "env.image_size: Value '32.5'"),
    ({"agent": ProtoConfig(batch_size="many")}, "agent.batch_size: Value 'many'"),
    ({"agent": "proto"}, "agent='proto': Merge error: str is not a subclass of AgentConfig"),
    ({"env": TrainingConfig()}, "env=TrainingConfig("),
])
def test_a_value_of_the_wrong_type_is_one_clear_error_before_anything_is_written(tmp_path, fields, message):
    with pytest.raises(ConfigError) as error:
        protorl.pretrain(run_dir=str(tmp_path / "run"), **fields)
    assert str(error.value).startswith(f"invalid config value {message}") and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_python_values_are_typed_as_the_command_lines_are(tmp_path):
    """The Python API and the command line share one typed path: "3" is 3 and 1 is 1.0 on both; an agent's dict
    changes its keys, and with another `name` starts from that agent's defaults."""
    config = configured(None, {"run_dir": tmp_path, "seed": "3", "agent": {"batch_size": "32"},
                               "runtime": {"max_hours": 1}})
    assert (config.seed, config.agent.batch_size, config.runtime.max_hours) == (3, 32, 1.0)
    assert type(config.runtime.max_hours) is float
    apt = configured(config, {"agent": {"name": "apt", "knn_k": 3}})
    assert (type(apt.agent).__name__, apt.agent.knn_k, apt.agent.batch_size) == ("APTConfig", 3, 512)
    with pytest.raises(ConfigError, match="unknown config key agent.num_prototypes"):
        configured(apt, {"agent": {"num_prototypes": 8}})


def test_paths_and_numpy_numbers_are_taken_as_the_values_they_stand_for(tmp_path):
    """`PhaseResult.snapshots` holds paths and seeds are often NumPy integers: both are taken from Python, as their
    string and integer, in groups and lists too."""
    config = configured(None, {"run_dir": tmp_path / "run", "seed": np.int64(3), "snapshot": Path("s.pt"),
                               "snapshots": {"at_frames": [np.int32(1000), 2000]},
                               "evaluation": {"every_frames": np.uint16(500)}, "pretrain_frames": 2000})
    assert (config.run_dir, config.seed, config.snapshot) == (str(tmp_path / "run"), 3, "s.pt")
    assert config.snapshots.at_frames == [1000, 2000] and type(config.snapshots.at_frames[0]) is int
    assert type(config.seed) is int and type(config.evaluation.every_frames) is int


@pytest.mark.slow
def test_a_fine_tuning_follows_its_snapshot_when_the_pretraining_moves(tmp_path):
    """A run directory records its snapshot by content (`snapshot_sha256`): rerun with the snapshot's new path
    after its pre-training directory moved, it continues; another snapshot at the old path is refused."""
    for seed in (1, 2):
        protorl.pretrain(tiny(tmp_path / f"pre{seed}", seed=seed))
    snapshot = tmp_path / "pre1" / "pretrain" / "snapshots" / "snapshot_1000.pt"
    finetune = tiny(tmp_path / "ft", snapshot=str(snapshot))
    protorl.finetune(finetune)
    assert OmegaConf.load(tmp_path / "ft" / "config.yaml").snapshot_sha256 is not None
    (tmp_path / "pre1").rename(tmp_path / "moved")
    moved = tmp_path / "moved" / "pretrain" / "snapshots" / "snapshot_1000.pt"
    (result,) = protorl.finetune(dataclasses.replace(finetune, snapshot=str(moved)))
    assert result.frames == 1000  # complete already: nothing to do, nothing refused
    (tmp_path / "pre1" / "pretrain" / "snapshots").mkdir(parents=True)
    (tmp_path / "pre2" / "pretrain" / "snapshots" / "snapshot_1000.pt").rename(snapshot)  # another one, old path
    with pytest.raises(ConfigError, match="other settings: snapshot_sha256="):
        protorl.finetune(finetune)


def test_tf32_applies_on_cuda_only_and_leaves_a_cpu_run_in_float32():
    from protorl.config import RuntimeConfig

    prepare_process(RuntimeConfig(device="cpu", threads=1, fast_malloc=False, tf32=True))
    assert torch.get_float32_matmul_precision() == "highest"
    if torch.cuda.is_available():
        prepare_process(RuntimeConfig(device="cuda", threads=1, fast_malloc=False, tf32=True))
        assert torch.get_float32_matmul_precision() == "high"
        prepare_process(RuntimeConfig(device="cuda", threads=1, fast_malloc=False))
        assert torch.get_float32_matmul_precision() == "highest"
