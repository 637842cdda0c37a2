"""Task data for agentrl: task files (tasks.py), SFT demonstrations (demos.py), the procedural suites (suites/)."""

from agentrl.data.tasks import TaskFormatError, load_tasks, task_from_row

__all__ = ["load_tasks", "task_from_row", "TaskFormatError"]
