"""Task data for agentrl: loading task files (tasks.py) and the procedural task suites (suites/)."""

from agentrl.data.tasks import TaskFormatError, load_tasks, task_from_row

__all__ = ["load_tasks", "task_from_row", "TaskFormatError"]
