"""`agentrl quickstart`: teach a small model to use tools on this CPU, end to end, and show before/after.

From nothing downloaded: build a small model + tokenizer, generate task suites, start the tool service and the
sandbox on loopback, SFT on scripted demonstrations (cold start), evaluate on the held-out split, run GRPO with
tools (embedded engine + Ray FSDP trainer), evaluate again, and write `report.md` + `curves.png`.
Every service is shut down at the end, on errors and on Ctrl-C.

The settings are a recipe, `recipes/quickstart/` (`recipe.py` reads it): the quickstart's own settings, an SFT
config and a training config with the real keys of `agentrl sft` and `agentrl train`. `run.py` is the driver,
`report.py` writes the report, `cli.py` is the command.

Each run starts clean in its run directory (`runs/quickstart`, `runs/quickstart-smoke` for `--smoke`): an
earlier run there is moved aside to `<run_dir>.old-N`. The report says which settings, seed and agentrl commit
produced it and how long each phase took.
"""
