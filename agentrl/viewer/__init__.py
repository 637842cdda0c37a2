"""`agentrl view`: a trajectory viewer and run dashboard in the browser (FastAPI + static assets in the package)."""
