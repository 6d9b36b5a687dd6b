"""protorl uses the public APIs of PyTorch, Hydra and OmegaConf only: no module of theirs whose path has a private
part is imported, and no private attribute of theirs is read, anywhere in the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference, in a test only
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import protorl
from protorl.app.cli import _sweep_jobs, register_configs

LIBRARIES = ("torch", "hydra", "omegaconf")
PACKAGE = Path(protorl.__file__).parent


def _private_uses(source: str) -> list[str]:
    """The private modules imported and the private attributes of the libraries read in `source`."""
    tree, found, aliases = ast.parse(source), [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        found.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            found += [name for name in names if any(part.startswith("_") and not part.startswith("__")
                                                    for part in name.split("."))]
            aliases.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _private_path(node.value):
            found.append(node.value)  # a private path written as a string, e.g. a class for Hydra to find
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                found.append(f"{ast.unparse(node)}")
    return found


def _private_path(text: str) -> bool:
    """Whether `text` is a dotted path with a private part into Hydra or OmegaConf, which instantiate what such a
    string names."""
    parts = text.split(".")
    return (len(parts) > 1 and parts[0] in ("hydra", "omegaconf") and all(part.isidentifier() for part in parts)
            and any(part.startswith("_") and not part.startswith("__") for part in parts))


def test_the_check_finds_private_imports_and_attributes():
    source = ("import torch\nfrom torch.utils import _pytree\nfrom torch.utils._python_dispatch import Mode\n"
              "import hydra._internal.utils\nfrom torch import nn as n\nx = torch._foreach_add_\ny = n._x\n"
              "z = torch.nn.functional.relu\nw = something._private\nv = torch.__version__\n"
              "s = 'hydra._internal.core_plugins.basic_sweeper.BasicSweeper'\nt = 'hydra.utils'\nu = 'a _b'\n")
    assert _private_uses(source) == ["torch.utils._pytree", "torch.utils._python_dispatch",
                                     "torch.utils._python_dispatch.Mode", "hydra._internal.utils",
                                     "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                     "torch._foreach_add_", "n._x"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_the_package_uses_no_private_api_of_its_libraries(path):
    assert _private_uses(path.read_text()) == []


@pytest.mark.parametrize("overrides", [
    ["experiment=maze_pixels_pretrain"],
    ["experiment=maze_pixels_pretrain", "seed=4,5", "agent=apt,proto"],
    ["seed=1,2,3", "agent.batch_size=8,16", "pretrain_frames=1000"],
    ["seed=range(1,4)", "seed=7,8"],
    ["seed=1,2", "+extra=1,2", "~pretrain_frames", "agent.lr=0.1", "agent.batch_size=8,16", "agent.lr=0.2,0.3"],
    ["task='a,b'", "snapshots.at_frames=[1,2]", "seed=choice(3,4)"],
])
def test_a_multiruns_jobs_are_expanded_as_hydras_basic_sweeper_expands_them(overrides):
    GlobalHydra.instance().clear()
    register_configs()  # the schema the commands' configs build on
    with initialize_config_module("protorl.conf", version_base="1.3"):
        fixed = [item for item in overrides if item.startswith("experiment=")]
        config = compose("pretrain", overrides=[*fixed, "run_dir=unused"], return_hydra_config=True)
        OmegaConf.set_readonly(config, False)
        config.hydra.overrides.task = overrides  # as a multirun's command line sets them
        assert config.hydra.runtime.choices["hydra/sweeper"] == "basic"
        params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        expected = [job for batch in BasicSweeper.split_arguments(
            parser.parse_overrides(params + list(config.hydra.overrides.task)), None) for job in batch]
        assert _sweep_jobs(config) == expected and len(expected) >= 1
    GlobalHydra.instance().clear()


def test_a_sweeper_other_than_hydras_basic_one_leaves_its_jobs_to_be_checked_as_they_start():
    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_module("protorl.conf", version_base="1.3"):
        config = compose("pretrain", overrides=["run_dir=unused"], return_hydra_config=True)
        OmegaConf.set_readonly(config, False)
        config.hydra.overrides.task = ["seed=1,2"]
        assert len(_sweep_jobs(config)) == 2
        config.hydra.runtime.choices["hydra/sweeper"] = "optuna"
        assert _sweep_jobs(config) is None
    GlobalHydra.instance().clear()
