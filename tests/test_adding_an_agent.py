"""An agent from another package: tests/toy_agent/ is a package of its own (`protorl_toy` and a pyproject.toml
whose entry point in the group `protorl.agents` names its agent). Installed, with no edit to protorl, it is
selectable as `agent=toy`: it pre-trains, writes a snapshot and fine-tunes through the real commands, and its
config is checked like any other.

"Installed" is what an installer leaves for `importlib.metadata` to find: the package on the path and a
`<name>-<version>.dist-info` directory holding its METADATA and the entry points of its pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
import torch

from protorl.agents import BUILT_IN, ENTRY_POINT_GROUP, agent_class, registered_agents
from protorl.config import ConfigError
from protorl.storage.snapshots import load_snapshot
from tests.runs import STATES_SHARED, TIMEOUT_S, assert_ok, assert_user_error, command_line, environment, read_csv

TOY = Path(__file__).parent / "toy_agent"


def install(site: Path, entry_points: dict[str, str] | None = None) -> Path:
    """Install tests/toy_agent into `site` as an installer would; `entry_points` replaces its pyproject.toml's."""
    project = tomllib.loads((TOY / "pyproject.toml").read_text())["project"]
    if entry_points is None:
        entry_points = project["entry-points"][ENTRY_POINT_GROUP]
    shutil.copytree(TOY / "protorl_toy", site / "protorl_toy")
    dist_info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                        f"Version: {project['version']}\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + "\n".join(lines) + "\n")
    return site


@pytest.fixture
def on_path(monkeypatch):
    """Put a directory on this process's import path, as for a package installed there; forget found agents."""
    def add(site: Path) -> None:
        monkeypatch.syspath_prepend(str(site))
        registered_agents.cache_clear()

    yield add
    registered_agents.cache_clear()


def run_toy(site: Path, command: str, *overrides: str, run_dir: Path) -> subprocess.CompletedProcess:
    """protorl-<command> with the toy package installed in `site`."""
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run(command_line(command, *STATES_SHARED, "agent=toy", *overrides, run_dir=run_dir),
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=run_dir.parent, check=False)


def test_an_installed_package_adds_its_agent_through_the_entry_point(tmp_path, on_path):
    assert "toy" not in registered_agents()
    on_path(install(tmp_path / "site"))
    assert agent_class("toy").__module__ == "protorl_toy" and set(BUILT_IN) < set(registered_agents())


def test_the_commands_help_lists_an_installed_agent(tmp_path):
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(install(tmp_path / "site")), env.get("PYTHONPATH")]))
    result = subprocess.run([*command_line("train", run_dir=tmp_path / "help")[:3], "--help"], capture_output=True,
                            text=True, timeout=TIMEOUT_S, env=env, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    agents = result.stdout.split("agent, the method:")[1].split("experiment,")[0]
    assert "toy" in agents.replace(",", " ").split() and "proto_variant" in agents


@pytest.mark.slow
def test_a_toy_agent_pretrains_and_finetunes_through_the_commands(tmp_path, on_path):
    site, run_dir = install(tmp_path / "site"), tmp_path / "toy"
    assert_ok(run_toy(site, "train", "pretrain_frames=1000", "finetune_frames=1000", "agent.reward_scale=2.0",
                      run_dir=run_dir))
    header, rows = read_csv(run_dir / "pretrain" / "train.csv")
    assert "intr_reward_mean" in header and float(rows[-1]["intr_reward_mean"]) > 0  # its declared metric
    on_path(site)  # reading a snapshot checks it against its agent: installed here too
    snapshot = load_snapshot(run_dir / "pretrain" / "snapshots" / "snapshot_1000.pt")
    assert snapshot["config"]["agent"]["name"] == "toy" and snapshot["config"]["agent"]["reward_scale"] == 2.0
    assert all(torch.is_tensor(v) for v in snapshot["agent"]["encoder"].values())
    _, evals = read_csv(run_dir / "finetune" / "eval.csv")
    assert [r["frames"] for r in evals] == ["0", "1000"]


@pytest.mark.slow
def test_the_toy_agents_config_is_checked_like_any_other(tmp_path):
    site = install(tmp_path / "site")
    result = run_toy(site, "pretrain", "pretrain_frames=1000", "agent.reward_scale=-1", run_dir=tmp_path / "bad")
    assert_user_error(result, "agent.reward_scale=-1")
    result = run_toy(site, "pretrain", "pretrain_frames=1000", "agent.num_prototypes=8", run_dir=tmp_path / "other")
    assert_user_error(result, "num_prototypes")  # Proto-RL's keys are not the toy agent's
    assert not (tmp_path / "bad").exists() and not (tmp_path / "other").exists()


@pytest.mark.parametrize("entry_points, fragment", [
    ({"toy": "protorl_toy:ToyConfig"}, "not a subclass of protorl.agents.Agent"),
    ({"proto": "protorl_toy:ToyAgent"}, "not one of protorl's own agents"),
    ({"other": "protorl_toy:ToyAgent"}, "its name must be the class's `name` ('toy')"),
    ({"toy": "protorl_toy:NoSuchAgent"}, "cannot be loaded (AttributeError"),
])
def test_a_wrong_entry_point_is_one_clear_error(tmp_path, on_path, entry_points, fragment):
    on_path(install(tmp_path / "site", entry_points))
    with pytest.raises(ConfigError, match="protorl.agents") as error:
        registered_agents()
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_an_agent_written_for_the_old_name_of_parts_is_one_clear_error(tmp_path, on_path):
    """An agent that overrides `steps(step)`, the old name of `parts(step)`, would have it silently ignored."""
    site = install(tmp_path / "site", {"toy": "protorl_toy_old:OldToyAgent"})
    (site / "protorl_toy_old.py").write_text("from protorl_toy import ToyAgent\n\n\nclass OldToyAgent(ToyAgent):\n"
                                             "    def steps(self, step):\n        return self.parts(step)\n")
    on_path(site)
    with pytest.raises(ConfigError, match=r"defines steps\(step\), which protorl now calls parts\(step\)") as error:
        registered_agents()
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_without_the_package_the_name_is_refused_listing_the_agents(tmp_path):
    result = subprocess.run(command_line("pretrain", *STATES_SHARED, "agent=toy", run_dir=tmp_path / "none"),
                            capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), cwd=tmp_path,
                            check=False)
    assert_user_error(result, "agent=toy: no such agent", *BUILT_IN)
    assert not (tmp_path / "none").exists()
