#!/usr/bin/env bash
# lookup example: tiny model -> SFT cold start on verified lookup transcripts -> GRPO -> held-out eval, on CPU.
# Train and held-out tasks each come with their own knowledge base (DATA/lookup-*.kb.jsonl) that the tasks
# point the lookup tool at (tools_kwargs.lookup.kb_path); held-out entities never occur in training.
#
#   bash examples/lookup/run.sh                                   # defaults: a pipeline demo (~2 min, README.md)
#   STEPS=1 N_TRAIN=8 N_EVAL=4 SFT_STEPS=0 TEST_FREQ=0 bash examples/lookup/run.sh   # smoke run
#   bash examples/lookup/run.sh actor.lr=3e-4 rollout.n=8         # extra args: `agentrl train` overrides
#
# At its defaults the run shows the pipeline, not learning: 10 GRPO steps of 4 prompts x 4 episodes leave
# held-out pass@1 where SFT put it (a user's run ended one task of 64 below the SFT model; README.md).
# `agentrl quickstart` shows GRPO learning on calc and lookup.
#
# Environment knobs (defaults in brackets): STEPS [10] RL steps; N_TRAIN [512] training tasks; N_EVAL [64]
# held-out tasks; N_DEMOS [2000] SFT transcripts; SFT_STEPS [300] SFT optimizer steps (0: skip SFT);
# SFT_LR [2e-3] SFT learning rate;
# SIZE [tiny] model size (tiny|small); BATCH [4] prompts per RL step; GROUP [4] episodes per prompt;
# TEST_FREQ [5] validate every N steps (0: never); VAL_TASKS [16] held-out tasks per validation;
# COMPARE [1] also evaluate the starting model side by side; OUT [runs/examples/lookup] output root.
# Rerunning reuses the model, the SFT output and the RL checkpoints (resume); delete OUT to start over.
set -euo pipefail

NAME=lookup exec bash "$(dirname "${BASH_SOURCE[0]}")/../suite_example.sh" "$@"
