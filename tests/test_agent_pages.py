"""Every hyper-parameter of every agent is documented: a field of an agent's config class is a line of its page
(docs/agents/<name>.md), and a field every agent shares (`AgentConfig`) is a line of the agents' overview
(docs/agents.md). Adding a hyper-parameter is its field and that line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from protorl.agents import BUILT_IN
from protorl.config import AgentConfig

DOCS = Path(__file__).resolve().parent.parent / "docs"
SHARED = {field.name for field in dataclasses.fields(AgentConfig)} - {"name"}


def undocumented(keys: set[str], page: Path) -> list[str]:
    text = page.read_text()
    return sorted(key for key in keys if f"`agent.{key}`" not in text)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_each_hyper_parameter_of_an_agent_is_on_its_page(name):
    own = {field.name for field in dataclasses.fields(BUILT_IN[name].config_class)} - SHARED - {"name"}
    assert undocumented(own, DOCS / "agents" / f"{name}.md") == []


def test_each_shared_hyper_parameter_is_on_the_agents_overview():
    assert undocumented(SHARED, DOCS / "agents.md") == []


def test_the_check_finds_a_key_missing_from_a_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("| `agent.lr` | 1e-4 |\n")
    assert undocumented({"lr", "new_key"}, page) == ["new_key"]
