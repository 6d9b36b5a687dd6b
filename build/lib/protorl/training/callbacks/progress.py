"""What a phase shows of its progress: a train.csv row per episode (or every few) and a progress bar."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

from protorl.agents import Agent
from protorl.config import LoggingConfig
from protorl.envs import TimeStep
from protorl.logs.logger import Logger
from protorl.training.callbacks import Callback, Every
from protorl.training.context import PhaseContext
from protorl.training.result import PhaseResult

log = logging.getLogger("protorl")


class ProgressLog(Callback):
    """Every `logging.every_episodes` episodes a train.csv row (the episode's return and length, frames per second,
    the update metrics averaged since the last row); a warning the first time a row shows a collapsed
    representation; the progress bar (`logging.progress_bar`)."""

    def __init__(self, cfg: LoggingConfig, context: PhaseContext, total_frames: int, action_repeat: int,
                 agent: Agent, logger: Logger, result: PhaseResult):
        """`total_frames`: where the loop ends."""
        self.cfg, self.context, self.total_frames, self.action_repeat = cfg, context, total_frames, action_repeat
        self.agent, self.logger, self.result = agent, logger, result
        self.bar: tqdm | None = None  # shown from the phase's start
        self.episode_reward, self.episode_steps = 0.0, 0  # of the episode under way
        self.episode_success = False  # whether a step of the episode under way had a positive reward
        self.collapse_warned = False
        self._last_log_time, self._last_log_frames = time.time(), 0
        self.rows = Every(cfg.every_episodes)  # counted in episodes

    def on_phase_start(self, frames: int) -> None:
        self._last_log_time, self._last_log_frames = time.time(), frames
        self.rows.advance(self.result.episodes)
        self.bar = tqdm(total=self.total_frames, initial=frames, unit="frame",
                        desc=f"{self.result.phase} {self.result.task}", disable=not self.cfg.progress_bar,
                        dynamic_ncols=True, mininterval=1.0 if sys.stderr.isatty() else 30.0,
                        smoothing=0)  # the remaining time from the average speed: a slow stretch moves it little

    def on_time_step(self, time_step: TimeStep) -> None:
        if time_step.first:
            self.episode_reward, self.episode_steps, self.episode_success = 0.0, 0, False
            return
        self.episode_reward += time_step.reward
        self.episode_success = self.episode_success or time_step.rewarded
        self.episode_steps += 1
        self.bar.update(self.action_repeat)

    def on_episode_end(self, frames: int) -> None:
        now = time.time()
        fps = (frames - self._last_log_frames) / max(now - self._last_log_time, 1e-9)
        if self.rows.due(self.result.episodes):
            row = self.logger.log_train({
                "frames": frames, "agent_steps": frames // self.action_repeat, "episode": self.result.episodes,
                "episode_reward": self.episode_reward,
                "episode_length_frames": self.episode_steps * self.action_repeat,
                "fps": fps, "total_time_s": self.context.elapsed(), "episode_success": float(self.episode_success)})
            self._last_log_time, self._last_log_frames = now, frames
            self._warn_if_collapsed(row)
        self.bar.set_postfix(episode_reward=f"{self.episode_reward:.1f}", fps=f"{fps:.0f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _warn_if_collapsed(self, row: dict) -> None:
        """One warning per phase, the first time a logged row shows a collapsed representation."""
        message = None if self.collapse_warned else self.agent.collapse_message(row)
        if message is not None:
            log.warning("%s %s", self.result.phase, message)
            self.collapse_warned = True

    def state_dict(self) -> dict:
        return {"collapse_warned": self.collapse_warned}

    def load_state_dict(self, checkpoint: dict) -> None:
        self.collapse_warned = bool(checkpoint["collapse_warned"])
