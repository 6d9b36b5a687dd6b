"""Fine-tuning from a pre-trained actor: what each remedy initialises, holds and trains, and the diagnostics a
fine-tuning logs. The paper's protocol (every remedy off) is the default."""

from __future__ import annotations

import copy
import csv

import pytest
import torch

from protorl.agents import ProtoAgent
from protorl.errors import SnapshotError
from tests.agents import tiny_config
from tests.agents import update as agent_update
from tests.runs import STATES, STATES_SHARED, run, tiny_agent


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def pretrained(build_agent, replay) -> ProtoAgent:
    """A pixel Proto-RL agent after a few pre-training updates: its actor and critic differ from fresh ones."""
    agent = build_agent("pretrain", seed=0)
    for step in range(6):
        agent_update(agent, replay, step)
    return agent


def _downstream(build_agent, pretrained, seed: int = 1, **overrides) -> ProtoAgent:
    agent = build_agent("frozen", cfg=tiny_config("proto", actor_update_every=1, **overrides), seed=seed)
    agent.load_pretrained(copy.deepcopy(pretrained.snapshot_state()))
    return agent


def test_paper_protocol_is_the_default(tiny_cfg):
    assert (tiny_cfg.critic_warmup_updates, tiny_cfg.actor_anchor_coef, tiny_cfg.init_critic) == (0, 0.0, False)


def test_downstream_starts_from_the_exploration_actor_with_a_fresh_critic_unless_init_critic(build_agent,
                                                                                           pretrained):
    paper = _downstream(build_agent, pretrained)
    assert _same(_params(paper.sac.actor), _params(pretrained.sac.actor))
    assert not _same(_params(paper.sac.critic), _params(pretrained.sac.critic))
    assert paper.sac.log_alpha.item() == pytest.approx(torch.tensor(0.1).log().item())
    warm = _downstream(build_agent, pretrained, init_critic=True)
    assert _same(_params(warm.sac.critic), _params(pretrained.sac.critic))
    assert _same(_params(warm.sac.critic_target), _params(pretrained.sac.critic))
    assert _same(_params(warm.sac.actor), _params(pretrained.sac.actor))
    for agent in (paper, warm):
        assert not any(p.requires_grad for m in agent.representation_modules().values() for p in m.parameters())


def test_init_critic_from_a_snapshot_without_critic_is_refused(build_agent, pretrained):
    state = copy.deepcopy(pretrained.snapshot_state())
    del state["critic"]
    agent = build_agent("frozen", cfg=tiny_config("proto", init_critic=True), seed=1)
    with pytest.raises(SnapshotError, match="init_critic"):
        agent.load_pretrained(state)


@pytest.mark.parametrize("warmup", [1, 3])
def test_warmup_holds_actor_and_temperature_bit_for_bit_for_exactly_n_updates(build_agent, pretrained, replay,
                                                                              warmup):
    agent = _downstream(build_agent, pretrained, critic_warmup_updates=warmup)
    actor, log_alpha, critic = _params(agent.sac.actor), agent.sac.log_alpha.detach().clone(), \
        _params(agent.sac.critic)
    representation = {name: _params(m) for name, m in agent.representation_modules().items()}
    for step in range(warmup):
        metrics = agent_update(agent, replay, step)
        assert "actor_loss" not in metrics
        assert _same(_params(agent.sac.actor), actor) and torch.equal(agent.sac.log_alpha, log_alpha)
    assert not _same(_params(agent.sac.critic), critic)  # the critic learned meanwhile
    metrics = agent_update(agent, replay, warmup)  # the first update after the warm-up trains them
    assert "actor_loss" in metrics
    assert not _same(_params(agent.sac.actor), actor) and not torch.equal(agent.sac.log_alpha, log_alpha)
    assert all(_same(_params(m), representation[name]) for name, m in agent.representation_modules().items())


def test_anchor_penalty_decays_linearly_and_changes_the_actor_update(build_agent, pretrained, replay):
    anchored = _downstream(build_agent, pretrained, actor_anchor_coef=2.0, actor_anchor_updates=10)
    assert [anchored.sac.anchor_coef(s) for s in (0, 5, 10, 20)] == pytest.approx([2.0, 1.0, 0.0, 0.0])
    paper = _downstream(build_agent, pretrained)
    assert paper.sac.anchor_coef(0) == 0.0
    for agent in (anchored, paper):  # two identical steps apart from the penalty
        agent.sac.actor.load_state_dict(anchored.sac.actor.state_dict())
    nudged = copy.deepcopy(pretrained.sac.actor.state_dict())
    for agent in (anchored, paper):  # move both actors away from the pre-trained one, so the penalty has a gradient
        with torch.no_grad():
            for name, value in agent.sac.actor.state_dict().items():
                value.copy_(nudged[name] + 0.05)
    replays = [copy.deepcopy(replay), copy.deepcopy(replay)]
    for agent, r in zip((anchored, paper), replays, strict=True):
        torch.manual_seed(5)
        agent_update(agent, r, 0)
    assert not _same(_params(anchored.sac.actor), _params(paper.sac.actor))
    assert _same(_params(anchored.sac.critic), _params(paper.sac.critic))  # the critic update is the same


def test_drift_is_measured_without_changing_the_paper_update(build_agent, pretrained, replay):
    measured = _downstream(build_agent, pretrained)
    unmeasured = _downstream(build_agent, pretrained)
    unmeasured.sac.pretrained_actor = None  # no reference: no drift
    replays = [copy.deepcopy(replay), copy.deepcopy(replay)]
    for agent, r in zip((measured, unmeasured), replays, strict=True):
        torch.manual_seed(7)
        for step in range(4):
            metrics = agent_update(agent, r, step)
        assert ("actor_drift" in metrics) == (agent is measured)
    assert _same(_params(measured.sac.actor), _params(unmeasured.sac.actor))
    assert metrics is not None and float(measured.sac.anchor_coef(0)) == 0.0


def test_drift_is_zero_at_the_start_and_grows_as_the_actor_moves(build_agent, pretrained, replay):
    agent = _downstream(build_agent, pretrained)
    features = torch.randn(16, agent.encoder.repr_dim)
    drift = (agent.sac.actor(features).mean - agent.sac.pretrained_actor(features).mean).norm(dim=-1)
    assert torch.equal(drift, torch.zeros(16))
    for step in range(6):
        metrics = agent_update(agent, replay, step)
    assert metrics["actor_drift"].item() > 0


def _rows(path):
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_a_tiny_fine_tuning_logs_its_diagnostics(tmp_path):
    """From states: pre-train, then fine-tune with the warm-up and the penalty; the diagnostics columns are filled."""
    run_dir = tmp_path / "run"
    result = run("train", *STATES, "pretrain_frames=2000", "finetune_frames=2000", "agent.critic_warmup_updates=20",
                 "agent.actor_anchor_coef=1.0", "agent.actor_anchor_updates=100", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    train = _rows(run_dir / "finetune" / "train.csv")
    evals = _rows(run_dir / "finetune" / "eval.csv")
    assert all(row["episode_success"] in ("0.0", "1.0") for row in train)
    assert all(0.0 <= float(row["success_rate"]) <= 1.0 for row in evals) and evals
    assert all(float(row["actor_drift"]) >= 0 for row in train if row["actor_drift"])
    assert any(row["actor_drift"] for row in train)
    assert all(0.0 <= float(row["intr_reward_share"]) <= 1.0 for row in train if row["intr_reward_share"])
    assert any(row["intr_reward_share"] for row in train)
    pretrain_train = _rows(run_dir / "pretrain" / "train.csv")
    assert not any(row["actor_drift"] for row in pretrain_train)  # no pre-trained actor to drift from


@pytest.mark.slow
def test_an_agent_without_an_online_mode_skips_the_comparison_and_says_so(tmp_path):
    """compare_without_pretraining with an agent that only learns from a snapshot (Random): one line says the
    comparison is skipped, and no scratch phase runs."""
    run_dir = tmp_path / "run"
    result = run("train", *STATES_SHARED, *tiny_agent("random"), "pretrain_frames=2000", "finetune_frames=2000",
                 "compare_without_pretraining=true", run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    assert "compare_without_pretraining: agent=random has no mode without pre-training; skipped" in result.stdout
    assert (run_dir / "finetune" / "result.json").is_file()
    assert not (run_dir / "finetune_scratch_point_mass_easy").exists()


@pytest.mark.slow
def test_train_compares_with_the_same_fine_tuning_without_pretraining(tmp_path):
    """compare_without_pretraining: each downstream task again, from nothing, over the same frames; the summary
    prints both side by side."""
    run_dir = tmp_path / "run"
    result = run("train", *STATES, "pretrain_frames=2000", "finetune_frames=2000", "compare_without_pretraining=true",
                 run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    scratch = run_dir / "finetune_scratch_point_mass_easy"
    assert (scratch / "result.json").is_file() and (run_dir / "finetune" / "result.json").is_file()
    assert _rows(scratch / "eval.csv") and not any(row["actor_drift"] for row in _rows(scratch / "train.csv"))
    assert any(row["repr_loss"] for row in _rows(scratch / "train.csv"))  # the representation learns: online
    lines = [line for line in result.stdout.splitlines() if "point_mass_easy" in line and "return" in line]
    assert [("no pre-training" in line, "pre-trained" in line) for line in lines] == [(False, True), (True, False)]
    assert "within seed noise" not in result.stdout
    rerun = run("train", *STATES, "pretrain_frames=2000", "finetune_frames=2000", "compare_without_pretraining=true",
                "comparison_note='one seed: within seed noise here'", run_dir=run_dir)  # a note: not another run
    assert rerun.returncode == 0 and "already complete" in rerun.stderr + rerun.stdout
    phases = [line.split()[0] for line in result.stdout.splitlines() if " frames " in line and "episodes" in line]
    assert phases == ["pretrain", "finetune", "scratch"]  # the summary tells the two fine-tunings apart
    rerun_lines = rerun.stdout.splitlines()  # the note follows the comparison it is about
    assert "no pre-training" in rerun_lines[rerun_lines.index("  one seed: within seed noise here") - 1]
    (scratch / "left.txt").write_text("from the run before")
    again = run("train", *STATES, "pretrain_frames=2000", "finetune_frames=2000", "compare_without_pretraining=true",
                "seed=2", "start_over=true", run_dir=run_dir)
    assert again.returncode == 0, again.stderr
    assert "already complete" not in again.stderr + again.stdout  # start_over ran the scratch phase again too
    assert not (scratch / "left.txt").exists() and (scratch / "result.json").is_file()
