"""The memory a run needs at its peak, estimated before anything is allocated: what it counts, refusals before
anything is written, and the estimate against the measured peak of tiny runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import protorl
from protorl.agents.optim import ShapeOnlyAdam, make_adam
from protorl.app.resources import _LiveBytes, _meminfo, check_memory, estimate_memory
from protorl.config import ConfigError
from protorl.training.phases import planned_phases
from tests.agents import tiny, tiny_config
from tests.runs import STATES, assert_user_error, environment, run

needs_meminfo = pytest.mark.skipif(not _meminfo(), reason="the operating system does not report its memory")


def test_live_bytes_counts_the_storages_held_at_once():
    with torch.device("meta"), _LiveBytes() as live:
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(500, dtype=torch.float64)  # 4000 bytes
        view = b[:10].t()  # no new storage
        del a
        c = torch.empty(250)  # 1000 bytes
    assert live.peak == 8000
    assert live.live == 5000
    assert view.untyped_storage().nbytes() == 4000 and c.numel() == 250


def test_adam_on_the_meta_device_creates_the_state_adam_creates():
    real = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    with torch.device("meta"):
        shapes_only = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    for net in (real, shapes_only):
        net(torch.zeros(5, 3, device=next(net.parameters()).device)).sum().backward()
    adam, meta_adam = make_adam(real.parameters(), 1e-3), make_adam(shapes_only.parameters(), 1e-3)
    assert isinstance(meta_adam, ShapeOnlyAdam) and not isinstance(adam, ShapeOnlyAdam)
    adam.step()
    meta_adam.step()
    for param, meta_param in zip(real.parameters(), shapes_only.parameters(), strict=True):
        state, meta_state = adam.state[param], meta_adam.state[meta_param]
        assert state.keys() == meta_state.keys()
        for key in state:
            assert (state[key].shape, state[key].dtype) == (meta_state[key].shape, meta_state[key].dtype), key


def test_the_agent_estimate_counts_its_batch_and_its_parameters_with_their_gradients_and_adam_state(tmp_path):
    def agent_bytes(**sizes) -> int:
        return estimate_memory(tiny(tmp_path, agent=tiny_config("proto", **sizes)), "pretrain").agent

    small, large_batch = agent_bytes(batch_size=8), agent_bytes(batch_size=512)
    assert large_batch > small
    more_prototypes = agent_bytes(batch_size=8, num_prototypes=16 + 10_000)
    # each added prototype: proj_dim float32 values, held as the parameter, its gradient and Adam's two moments
    assert more_prototypes - small >= 10_000 * 16 * 4 * 4


def test_the_replay_estimate_follows_the_frames_a_phase_writes(tmp_path):
    pixels = dict(env={"obs": "pixels", "image_size": 32}, replay={"capacity": 100_000})
    short = estimate_memory(tiny(tmp_path, pretrain_frames=1000, **pixels), "pretrain")
    long = estimate_memory(tiny(tmp_path, pretrain_frames=8000, **pixels), "pretrain")
    frame = 3 * 32 * 32  # uint8
    assert long.replay - short.replay >= (8000 - 1000) // 8 * frame  # a slot per agent step of 8 frames
    assert long.replay_reserved == short.replay_reserved >= 100_000 * frame


@needs_meminfo
def test_a_run_this_machine_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    on_cpu = {"device": "cpu", "threads": 1}  # the host's check (a GPU's: the tests below)
    huge = tiny(tmp_path / "a", agent=tiny_config("proto", num_prototypes=10**10), runtime=on_cpu)  # 640 GB
    with pytest.raises(ConfigError, match=r"at its peak .* GiB are available; lower agent.batch_size"):
        protorl.pretrain(huge)
    with pytest.raises(ConfigError, match="replay.capacity=1000000000000: the buffer would reserve"):
        protorl.pretrain(tiny(tmp_path / "b", replay={"capacity": 10**12}, runtime=on_cpu))
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@needs_meminfo
def test_the_command_line_refuses_it_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    result = run("pretrain", *STATES, "agent.num_prototypes=10000000000", "pretrain_frames=1000", "runtime.device=cpu",
                 run_dir=run_dir)
    assert_user_error(result, "at its peak", "GiB are available")
    assert not run_dir.exists()


@pytest.mark.slow
@needs_meminfo
@pytest.mark.parametrize("obs", ["states", "pixels"])
def test_the_estimate_is_within_2x_of_the_peak_resident_memory_of_a_tiny_run(tmp_path, obs):
    script = textwrap.dedent(f"""
        import json, protorl
        from pathlib import Path
        from protorl.app.resources import estimate_memory
        from tests.agents import tiny
        cfg = tiny({str(tmp_path / "run")!r}, env={{"obs": {obs!r}, "image_size": 32}}, replay={{"capacity": 500}},
                   runtime={{"device": "cpu"}})
        estimate = estimate_memory(cfg, "train")  # as a command does, before it allocates anything
        protorl.train(cfg)
        peak_kib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                        if line.startswith("VmHWM:"))
        print(json.dumps({{"estimate": estimate.total, "peak": peak_kib * 1024}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=environment(), cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["peak"] / 2 <= figures["estimate"] <= figures["peak"] * 2, figures


@pytest.mark.parametrize("name", ["proto", "apt", "icm", "random", "drq"])
@pytest.mark.parametrize("obs", ["states", "pixels"])
def test_every_agent_is_estimated_in_every_phase_it_runs(tmp_path, name, obs):
    cfg = tiny(tmp_path, env={"obs": obs, "image_size": 32}, agent=tiny_config(name),
               compare_without_pretraining=True)
    estimate = estimate_memory(cfg, "train")
    assert estimate.agent > 0 and estimate.replay > 0 and estimate.process > 0


def test_on_a_gpu_the_agent_is_checked_against_the_gpus_free_memory(tmp_path, monkeypatch):
    cfg = tiny(tmp_path, runtime={"device": "cuda"}, agent=tiny_config("proto", batch_size=512))
    agent_bytes = estimate_memory(cfg, "pretrain").agent
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (agent_bytes // 2, 80 * 2**30))
    with pytest.raises(ConfigError, match=r"the agent would need about .* GiB of cuda at its peak"):
        check_memory(cfg, planned_phases(cfg, "pretrain", snapshot_given=False))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (agent_bytes * 2, 80 * 2**30))
    assert check_memory(cfg, planned_phases(cfg, "pretrain", snapshot_given=False)).agent == agent_bytes


@pytest.mark.parametrize(("capacity", "replay_on_device", "refused"), [
    (500, None, True), (500, True, True), (500, False, False),  # frames under half the free memory
    (5000, None, False), (5000, True, True), (5000, False, False),  # over half: by default on the host
])
def test_on_a_gpu_the_replays_frames_count_where_the_run_keeps_them(tmp_path, monkeypatch, capacity,
                                                                    replay_on_device, refused):
    """The frames go to the GPU with replay.on_device=true, and by default when they take under half its free
    memory (as the training loop decides): then they count with the agent against that memory."""
    cfg = tiny(tmp_path, runtime={"device": "cuda"}, env={"obs": "pixels", "image_size": 32},
               replay={"capacity": capacity, "on_device": replay_on_device}, agent=tiny_config("proto"))
    estimate = estimate_memory(cfg, "pretrain")
    assert estimate.device_frames == capacity * 3 * 32 * 32  # a uint8 RGB frame per slot (stacks are rebuilt)
    free = estimate.agent + estimate.device_frames // 2  # the agent fits, the agent and the frames do not
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    if refused:
        with pytest.raises(ConfigError, match="with the replay's frames"):
            check_memory(cfg, planned_phases(cfg, "pretrain", snapshot_given=False))
    else:
        check_memory(cfg, planned_phases(cfg, "pretrain", snapshot_given=False))


def test_the_estimate_runs_every_part_of_the_update_whatever_its_schedules(tmp_path):
    def agent_bytes(**fields) -> int:
        return estimate_memory(tiny(tmp_path, agent=tiny_config("proto", **fields)), "pretrain").agent

    every_step = agent_bytes(actor_update_every=1, critic_target_update_every=1)
    assert agent_bytes(actor_update_every=3, critic_target_update_every=5, critic_warmup_updates=1000) == every_step


def test_bfloat16_convolutions_are_estimated_in_float32(tmp_path):
    pixels = {"obs": "pixels", "image_size": 32}
    cfg = tiny(tmp_path, env=pixels, agent=tiny_config("proto", bf16_autocast=True))
    plain = tiny(tmp_path, env=pixels, agent=tiny_config("proto"))
    assert estimate_memory(cfg, "pretrain").agent == estimate_memory(plain, "pretrain").agent
