"""Task data for agentrl: loading task files (tasks.py) and the procedural task suites (suites/)."""
