"""Task names: `domain_task` for DeepMind Control and the paper's tasks, `gym:<id>` for any Gymnasium environment."""

from __future__ import annotations

GYMNASIUM_PREFIX = "gym:"


def gymnasium_id(task: str) -> str | None:
    """`'gym:Pendulum-v1'` -> `'Pendulum-v1'`; None for a task that is not a Gymnasium one."""
    return task[len(GYMNASIUM_PREFIX):] if task.startswith(GYMNASIUM_PREFIX) else None
