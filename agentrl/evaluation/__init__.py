"""Held-out evaluation: run the agent loop on a suite, score it, write eval.json and a Markdown summary."""
