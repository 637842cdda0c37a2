"""The RL trainer: pure RL math (algos), batching, the FSDP2 policy worker, weight sync and the RL loop."""
