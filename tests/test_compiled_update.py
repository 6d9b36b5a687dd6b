"""`runtime.compile_update`: an agent's whole update compiled as one graph per combination of its parts.

The compiled update draws the same random numbers as the eager one (inductor's `fallback_random`) and differs
only by the rounding of fused arithmetic and of the traceable Adam: after a few updates from the same state and
batches, its losses and parameters equal the eager update's to float32 rounding amplified by those updates.
Compiling takes seconds per graph, so these tests are in the slow tier.
"""

from __future__ import annotations

import copy
import dataclasses
import signal

import pytest
import torch

from protorl.agents import RandomAgent
from protorl.errors import ConfigError
from protorl.replay import Batch
from protorl.storage.snapshots import load_snapshot
from tests.agents import CPU, PIXEL_OBS_SHAPE, tiny_agent, tiny_config
from tests.runs import STATES, assert_ok, read_rows, run, start, wait_for_rows

UPDATES = 12  # past the queue's filling and the projector's settling, so the compiled graphs run
# float32 rounding (~1e-7) grows through a dozen dependent Adam steps; a wrong term in a loss moves these by > 1e-2
TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}


def named(name: str):
    """assert_close's message with the name in front of its figures."""
    return lambda message: f"{name}: {message}"


def batches(count: int, seed: int = 1, size: int = 8) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    def one() -> Batch:
        return Batch(obs=torch.randn(size, 4, generator=generator),
                     action=torch.rand(size, 2, generator=generator) * 2 - 1,
                     reward=torch.rand(size, 1, generator=generator), discount=torch.ones(size, 1),
                     next_obs=torch.randn(size, 4, generator=generator))

    return [one() for _ in range(count)]


def updates(agent, data: list[Batch], first_step: int = 0) -> list[dict]:
    torch.manual_seed(5)
    return [agent.update(batch, first_step + step) for step, batch in enumerate(data)]


def states_agent(name: str, mode: str):
    return tiny_agent(name, mode, seed=0, obs_type="states", obs_shape=(4,))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "mode"), [("proto", "pretrain"), ("proto", "frozen"), ("random", "pretrain"),
                                            ("icm", "pretrain"), ("apt", "pretrain"), ("drq", "online")])
def test_compiled_update_equals_eager_to_rounding(name, mode):
    eager, compiled = states_agent(name, mode), states_agent(name, mode)
    compiled.compile_update()
    data = batches(UPDATES)
    eager_metrics, compiled_metrics = updates(eager, data), updates(compiled, data)

    assert compiled._compiled.graphs, "no update ran compiled"
    assert compiled._compiled.recompilations == 0
    for key, value in eager_metrics[-1].items():
        torch.testing.assert_close(compiled_metrics[-1][key], value, **TOLERANCE, msg=named(key))
    eager_state, compiled_state = eager.sac.state_dict(), compiled.sac.state_dict()
    for key in ("actor", "critic", "critic_target"):
        for param, value in eager_state[key].items():
            torch.testing.assert_close(compiled_state[key][param], value, **TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pretrain", "frozen"])
def test_compiled_pixel_update_equals_eager_to_rounding(mode):
    """From pixels: the augmentation's random shifts, the conv encoder (in micro-batches) and its gradient."""
    eager, compiled = tiny_agent("proto", mode, seed=0), tiny_agent("proto", mode, seed=0)
    compiled.compile_update()
    data = pixel_batches(UPDATES)
    eager_metrics, compiled_metrics = updates(eager, data), updates(compiled, data)
    assert compiled._compiled.graphs and compiled._compiled.recompilations == 0
    for key, value in eager_metrics[-1].items():
        torch.testing.assert_close(compiled_metrics[-1][key], value, **TOLERANCE, msg=named(key))


def pixel_batches(count: int, device: torch.device = CPU) -> list[Batch]:
    generator = torch.Generator().manual_seed(3)

    def frames() -> torch.Tensor:
        return torch.randint(0, 256, (8, *PIXEL_OBS_SHAPE), dtype=torch.uint8, generator=generator)

    return [on(Batch(obs=frames(), action=torch.rand(8, 2, generator=generator) * 2 - 1,
                     reward=torch.rand(8, 1, generator=generator), discount=torch.ones(8, 1), next_obs=frames()),
               device) for _ in range(count)]


def on(batch: Batch, device: torch.device) -> Batch:
    return Batch(*(getattr(batch, field.name).to(device) for field in dataclasses.fields(Batch)))


def reachable(root: object) -> tuple[dict[int, tuple[torch.Tensor, str]], list[torch.nn.Module]]:
    """Every tensor reachable from an agent through protorl's and torch's objects, lists and dicts (id -> tensor,
    path), and every module met on the way."""
    seen, tensors, modules, stack = set(), {}, [], [(root, "agent")]
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            tensors[id(obj)] = (obj, path)
            continue
        if isinstance(obj, torch.nn.Module):
            modules.append(obj)
        if isinstance(obj, dict):
            items = obj.items()
        elif isinstance(obj, (list, tuple)):
            items = enumerate(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("protorl", "torch"):
            items = vars(obj).items()
        else:
            continue
        stack.extend((value, f"{path}.{key}") for key, value in items)
    return tensors, modules


@pytest.mark.parametrize(("name", "mode", "obs"), [
    ("proto", "pretrain", "states"), ("proto", "frozen", "states"), ("proto", "online", "states"),
    ("proto", "pretrain", "pixels"), ("proto", "frozen", "pixels"), ("random", "pretrain", "states"),
    ("icm", "pretrain", "states"), ("apt", "pretrain", "states"), ("drq", "online", "states")])
def test_every_tensor_an_update_writes_is_a_modules_parameter_or_buffer(name, mode, obs):
    """A CUDA graph may write in place only into a compiled graph's static inputs, which are modules' parameters
    and buffers: any other tensor an update changes (Adam's moments, the queue, running statistics) would make
    inductor skip CUDA graphs for the whole update (protorl.agents.inplace)."""
    shape = {"states": {"obs_type": "states", "obs_shape": (4,)}, "pixels": {}}[obs]
    agent = tiny_agent(name, mode, seed=0, **shape)
    tensors, modules = reachable(agent)
    before = {key: tensor.detach().clone() for key, (tensor, _) in tensors.items()}
    updates(agent, batches(UPDATES) if obs == "states" else pixel_batches(UPDATES))
    held = {id(tensor) for module in modules for tensor in [*module.parameters(), *module.buffers()]}
    written = [path for key, (tensor, path) in tensors.items()
               if before[key].shape != tensor.shape or not torch.equal(before[key], tensor.detach())]
    assert written, "the update wrote nothing"
    assert sorted(path for key, (_, path) in tensors.items() if key not in held and path in written) == []


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize(("name", "mode", "obs"), [("proto", "pretrain", "states"), ("proto", "frozen", "states"),
                                                   ("random", "pretrain", "states"), ("proto", "pretrain", "pixels"),
                                                   ("proto", "frozen", "pixels")])
def test_a_cuda_graph_update_equals_the_eager_one_on_the_gpu(name, mode, obs):
    """On CUDA the compiled update is replayed as a CUDA graph (a graph launch, seen by the profiler) and computes
    what the eager update computes on the same GPU, random draws included."""
    cuda = torch.device("cuda")
    shape = {"states": {"obs_type": "states", "obs_shape": (4,)}, "pixels": {}}[obs]
    eager, compiled = (tiny_agent(name, mode, seed=0, device=cuda, **shape) for _ in range(2))
    compiled.compile_update(cuda_graphs=True)
    data = [on(batch, cuda) for batch in batches(UPDATES)] if obs == "states" else pixel_batches(UPDATES, cuda)
    eager_metrics, compiled_metrics = updates(eager, data), updates(compiled, data)
    assert compiled._compiled.graphs and compiled._compiled.recompilations == 0
    for key, value in eager_metrics[-1].items():
        torch.testing.assert_close(compiled_metrics[-1][key], value.float(), **TOLERANCE, msg=named(key))
    for param, value in eager.sac.state_dict()["critic"].items():
        torch.testing.assert_close(compiled.sac.state_dict()["critic"][param], value, **TOLERANCE, msg=named(param))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        compiled.update(data[-1], UPDATES)
        torch.cuda.synchronize()
    assert any("cudaGraphLaunch" in event.name for event in profile.events()), "not replayed as a CUDA graph"


@pytest.mark.slow
def test_checkpoints_pass_between_compiled_and_eager_updates():
    """A compiled agent's state loads into an eager one and back; each goes on as the other would."""
    data = batches(2 * UPDATES)
    compiled = states_agent("proto", "pretrain")
    compiled.compile_update()
    updates(compiled, data[:UPDATES])
    state = copy.deepcopy(compiled.state_dict())

    eager = states_agent("proto", "pretrain")
    eager.load_state_dict(state)
    torch.manual_seed(7)
    eager_next = updates(eager, data[UPDATES:], first_step=UPDATES)
    torch.manual_seed(7)
    compiled_again = states_agent("proto", "pretrain")
    compiled_again.compile_update()
    compiled_again.load_state_dict(state)
    compiled_next = updates(compiled_again, data[UPDATES:], first_step=UPDATES)
    for key, value in eager_next[-1].items():
        torch.testing.assert_close(compiled_next[-1][key], value, **TOLERANCE, msg=named(key))


@pytest.mark.slow
def test_a_compiled_run_killed_resumes_to_its_uninterrupted_result(tmp_path):
    """SIGKILL after the third episode, before the checkpoint at frame 4000: the rerun resumes from frame 2000
    and ends where the uninterrupted compiled run ended, row for row and tensor for tensor."""
    command = [*STATES, "runtime.compile_update=true", "pretrain_frames=5000", "checkpoints.every_frames=2000",
               "checkpoints.keep_completed=true"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert_ok(run("pretrain", *command, run_dir=straight))
    process = start("pretrain", *command, run_dir=killed)
    train_csv = killed / "pretrain" / "train.csv"
    wait_for_rows(process, train_csv, 3, timeout_s=300)  # compiling takes seconds
    process.send_signal(signal.SIGKILL)
    process.wait()

    result = run("pretrain", *command, run_dir=killed)
    assert_ok(result)
    assert "(frame 2000)" in result.stdout + result.stderr
    assert "recompiled" not in result.stdout + result.stderr
    assert read_rows(train_csv) == read_rows(straight / "pretrain" / "train.csv")
    final = [load_snapshot(run_dir / "pretrain" / "snapshots" / "snapshot_5000.pt")["agent"]
             for run_dir in (straight, killed)]
    for part in ("encoder", "head", "actor", "critic", "queue"):
        for name, value in final[0][part].items():
            other = final[1][part][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (part, name)


@pytest.mark.slow
def test_a_recompilation_is_reported_in_one_line(caplog):
    """A batch of another size needs a new graph: the update says so, and computes what the eager one does."""
    eager, compiled = states_agent("random", "pretrain"), states_agent("random", "pretrain")
    compiled.compile_update()
    data = batches(4) + batches(1, seed=2, size=6)
    eager_metrics, compiled_metrics = updates(eager, data), updates(compiled, data)
    assert compiled._compiled.recompilations == 1
    lines = [record.getMessage() for record in caplog.records if "recompiled" in record.getMessage()]
    assert len(lines) == 1 and "random pretrain" in lines[0] and "\n" not in lines[0]
    torch.testing.assert_close(compiled_metrics[-1]["critic_loss"], eager_metrics[-1]["critic_loss"], **TOLERANCE)


@pytest.mark.slow
def test_metrics_leave_a_cuda_graph_update_in_one_copy():
    """With `cuda_graphs` (on a CPU the graphs themselves are plain), the metrics are copied out of the update's
    memory in one stacked copy, as float32: the same values as the eager update's."""
    eager, compiled = states_agent("random", "pretrain"), states_agent("random", "pretrain")
    compiled.compile_update(cuda_graphs=True)
    data = batches(4)
    eager_metrics, compiled_metrics = updates(eager, data), updates(compiled, data)
    assert all(value.dtype == torch.float32 for value in compiled_metrics[-1].values())
    assert len({value.untyped_storage().data_ptr() for value in compiled_metrics[-1].values()}) == 1
    for key, value in eager_metrics[-1].items():
        torch.testing.assert_close(compiled_metrics[-1][key], value.float(), **TOLERANCE, msg=named(key))


@pytest.mark.slow
def test_agents_compiled_one_after_another_each_run_compiled():
    """A run's phases build one agent after another (protorl-train: a pre-training, four fine-tunings and more): each
    runs its own compiled graphs, past torch's limit of 8 graphs per function, and computes what the eager one does."""
    data = batches(2)
    for _ in range(5):  # 2 graphs each
        agent, eager = states_agent("random", "frozen"), states_agent("random", "frozen")
        agent.compile_update()
        updates(agent, data)  # compiles its two graphs
        with torch.compiler.set_stance("fail_on_recompile"):  # running eagerly or compiling again would raise
            compiled_metrics = updates(agent, data)[-1]
        updates(eager, data)
        for key, value in updates(eager, data)[-1].items():
            torch.testing.assert_close(compiled_metrics[key], value, **TOLERANCE, msg=named(key))
        assert len(agent._compiled.graphs) == 2 and agent._compiled.recompilations == 0


class HostReadingAgent(RandomAgent):
    """Random's update behind a branch on a tensor's value, read on the host: not one graph."""

    def update_pretrain(self, batch: Batch, parts):
        if batch.reward.sum().item() > 0:
            return super().update_pretrain(batch, parts)
        return super().update_pretrain(batch, parts)


def test_an_update_that_does_not_compile_whole_is_refused_in_one_line():
    agent = HostReadingAgent("states", (4,), (2,), tiny_config("random"), torch.device("cpu"), "pretrain")
    agent.compile_update()
    with pytest.raises(ConfigError, match=r"^runtime.compile_update=true: the update of random pretrain does not "
                                          r"compile as one graph \(.+\); run without runtime.compile_update$"):
        agent.update(batches(1)[0], 0)
