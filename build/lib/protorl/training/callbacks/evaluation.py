"""Evaluation: episodes with the policy's mean action, on an environment of their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protorl.agents import Agent
from protorl.config import EvaluationConfig
from protorl.envs import Env
from protorl.logs.logger import Logger
from protorl.training.callbacks import Callback, Every
from protorl.training.context import PhaseContext
from protorl.training.result import PhaseResult


class Evaluation(Callback):
    """Every `evaluation.every_frames` and at the end of a phase that evaluates: `evaluation.episodes` episodes,
    their mean return to eval.csv and the result, the first one's video (`evaluation.save_video`) to videos/."""

    def __init__(self, cfg: EvaluationConfig, context: PhaseContext, env: Env, agent: Agent, logger: Logger,
                 result: PhaseResult):
        """`env`: the evaluation's own environment."""
        self.cfg, self.context, self.env, self.agent = cfg, context, env, agent
        self.logger, self.result = logger, result
        self.evaluates = cfg.episodes > 0 and (result.phase == "finetune" or cfg.during_pretrain)
        self.schedule = Every(cfg.every_frames, first=0)

    def before_step(self, frames: int) -> None:
        if self.evaluates and self.schedule.due(frames):
            self.evaluate(frames)

    def on_phase_end(self, frames: int) -> None:
        if self.evaluates:
            self.evaluate(frames)

    def evaluate(self, frames: int) -> None:
        """Run `evaluation.episodes` episodes with the policy's mean action; log their mean return."""
        self.context.check_finite(frames)
        rewards, successes = [], []
        video_frames: list[np.ndarray] = []
        record = self.cfg.save_video
        for _ in range(self.cfg.episodes):
            time_step = self.env.reset()
            total, success = 0.0, False
            while True:
                if record:
                    video_frames.append(self.env.render(self.cfg.video_size))
                time_step = self.env.step(self.agent.act(time_step.obs, sample=False))
                total += time_step.reward
                success = success or time_step.rewarded
                if time_step.last:
                    break
            rewards.append(total)
            successes.append(success)
            record = False  # one video per evaluation: its first episode
        mean = float(np.mean(rewards))
        self.logger.log_eval({"frames": frames, "agent_steps": frames // self.env.action_repeat,
                              "episode_reward": mean, "episode_reward_std": float(np.std(rewards)),
                              "episodes": len(rewards), "total_time_s": self.context.elapsed(),
                              "success_rate": float(np.mean(successes))})
        self.result.eval_rewards.append((frames, mean))
        if video_frames:
            _write_video(self.result.out_dir / "videos" / f"eval_{frames}.mp4", video_frames)

    def state_dict(self) -> dict:
        return {"next_eval_frames": self.schedule.next}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.schedule.next = int(checkpoint["next_eval_frames"])


def _write_video(path: Path, frames: list[np.ndarray]) -> None:
    import imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(path, frames, fps=30, macro_block_size=1)
