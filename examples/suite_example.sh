#!/usr/bin/env bash
# Shared pipeline of the suite examples (examples/calc, examples/lookup): data -> model -> SFT cold start ->
# GRPO -> held-out eval. Called by their run.sh with NAME set; the knobs are documented there.
set -euo pipefail

: "${NAME:?set NAME to the suite (calc or lookup)}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source examples/knobs.sh

echo "== [$NAME] a pipeline demo: at its default budgets GRPO does not move held-out pass@1"
echo "   (examples/$NAME/README.md); \`agentrl quickstart\` shows GRPO learning"
echo "== [$NAME] data -> $DATA"
"$AGENTRL" data make "$NAME" --split train --n "$N_TRAIN" "$DATA/$NAME-train.jsonl" --seed 0
"$AGENTRL" data make "$NAME" --split heldout --n "$N_EVAL" "$DATA/$NAME-heldout.jsonl" --seed 0

build_base_model

START=$BASE
if (( SFT_STEPS > 0 )); then
  START=$OUT/sft/model
  if [[ ! -f $START/config.json ]]; then
    echo "== [$NAME] SFT cold start: $SFT_STEPS steps on $N_DEMOS demonstrations"
    # seed 1: demonstrations on other tasks than the RL prompts (seed 0)
    "$AGENTRL" data demos "$NAME" --n "$N_DEMOS" "$DATA/$NAME-sft.jsonl" --seed 1
    "$AGENTRL" sft configs/sft/tiny_cpu.yaml model.path="$BASE" "data.train_files=[$DATA/$NAME-sft.jsonl]" \
      sft.run_dir="$OUT/sft" sft.max_steps="$SFT_STEPS" sft.epochs=100 sft.log_freq=10 \
      actor.lr="$SFT_LR" actor.warmup_steps=$(( SFT_STEPS / 10 ))
  fi
fi

echo "== [$NAME] GRPO: $STEPS steps x $BATCH prompts x $GROUP episodes from $START"
"$AGENTRL" train "$CONFIG" model.path="$START" \
  "data.train_files=[$DATA/$NAME-train.jsonl]" "data.val_files=[$DATA/$NAME-heldout.jsonl]" \
  data.train_batch_size="$BATCH" actor.ppo_mini_batch_size="$BATCH" rollout.n="$GROUP" \
  data.val_batch_size="$VAL_TASKS" trainer.test_freq="$TEST_FREQ" \
  trainer.total_steps="$STEPS" trainer.save_freq="$STEPS" trainer.run_dir="$OUT/rl" "$@"

echo "== [$NAME] held-out eval on $N_EVAL tasks -> $OUT/eval"
COMPARE_ARGS=()
if [[ $COMPARE == 1 ]]; then COMPARE_ARGS=(--compare "$START" --compare-name start); fi
"$AGENTRL" eval --model "$OUT/rl/final_model" --name grpo --suite "$DATA/$NAME-heldout.jsonl" --config "$CONFIG" \
  --out "$OUT/eval" "${COMPARE_ARGS[@]}"

echo "== [$NAME] done: metrics $OUT/rl/metrics.jsonl, eval $OUT/eval"
