#!/usr/bin/env bash
# code_sandbox example: the `code` suite with a stateful python tool running in the code sandbox, unit-test
# rewards graded by the same sandbox, on CPU: sandbox service -> tiny model -> SFT cold start -> GRPO -> eval.
#
#   bash examples/code_sandbox/run.sh                           # defaults: a pipeline demo (~4 min, README.md)
#   STEPS=1 N_TRAIN=8 N_EVAL=4 SFT_STEPS=0 TEST_FREQ=0 bash examples/code_sandbox/run.sh   # smoke run
#   SANDBOX_URL=http://127.0.0.1:8080 bash examples/code_sandbox/run.sh   # use a sandbox that is already running
#   bash examples/code_sandbox/run.sh actor.lr=3e-4             # extra args: `agentrl train` overrides
#
# At its defaults the run shows the pipeline, not learning: 10 GRPO steps of 4 prompts x 4 episodes leave
# held-out pass@1 where SFT put it (a user's run ended one task of 64 below the SFT model; README.md).
# `agentrl quickstart --suites code` shows GRPO learning on this suite.
#
# Environment knobs (defaults in brackets): STEPS [10] RL steps; N_TRAIN [512] training tasks; N_EVAL [64]
# held-out tasks; N_DEMOS [2000] SFT transcripts; SFT_STEPS [300] SFT optimizer steps (0: skip SFT);
# SFT_LR [2e-3] SFT learning rate;
# SIZE [tiny] model size (tiny|small); BATCH [4] prompts per RL step; GROUP [4] episodes per prompt;
# TEST_FREQ [5] validate every N steps (0: never); VAL_TASKS [16] held-out tasks per validation;
# COMPARE [1] also evaluate the starting model side by side; OUT [runs/examples/code_sandbox] output root;
# SANDBOX_URL [unset: start `agentrl sandbox serve` on a free loopback port, stopped on exit].
# The sandbox isolates code with bubblewrap + cgroups (`apt-get install bubblewrap`); see sandbox/ for limits.
# Rerunning reuses the model, the SFT output and the RL checkpoints (resume); delete OUT to start over.
set -euo pipefail

NAME=code_sandbox
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source examples/knobs.sh
mkdir -p "$OUT"

SANDBOX_PID=
stop_sandbox() {
  if [[ -n $SANDBOX_PID ]]; then
    kill -TERM -- "-$SANDBOX_PID" 2>/dev/null || true   # its own process group: the service and its runners
    wait "$SANDBOX_PID" 2>/dev/null || true
  fi
}
trap stop_sandbox EXIT

if [[ -z ${SANDBOX_URL:-} ]]; then
  PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  SANDBOX_URL=http://127.0.0.1:$PORT
  echo "== [$NAME] sandbox on $SANDBOX_URL (log $OUT/sandbox.log)"
  setsid "$AGENTRL" sandbox serve --host 127.0.0.1 --port "$PORT" > "$OUT/sandbox.log" 2>&1 &
  SANDBOX_PID=$!
fi
# wait (up to 60 s) for GET /v1/ping
"$PYTHON" - "$SANDBOX_URL" <<'EOF'
import sys, time, urllib.request
url = sys.argv[1] + "/v1/ping"
deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(f"the sandbox at {sys.argv[1]} did not answer /v1/ping within 60 s")
    time.sleep(0.2)
EOF

echo "== [$NAME] a pipeline demo: at its default budgets GRPO does not move held-out pass@1"
echo "   (examples/$NAME/README.md); \`agentrl quickstart --suites code\` shows GRPO learning"
echo "== [$NAME] data -> $DATA"
"$AGENTRL" data make code --split train --n "$N_TRAIN" "$DATA/code-train.jsonl" --seed 0
"$AGENTRL" data make code --split heldout --n "$N_EVAL" "$DATA/code-heldout.jsonl" --seed 0

build_base_model

START=$BASE
if (( SFT_STEPS > 0 )); then
  START=$OUT/sft/model
  if [[ ! -f $START/config.json ]]; then
    echo "== [$NAME] SFT cold start: $SFT_STEPS steps on $N_DEMOS demonstrations (python calls run in the sandbox)"
    "$AGENTRL" data demos code --n "$N_DEMOS" "$DATA/code-sft.jsonl" --seed 1 --sandbox-url "$SANDBOX_URL"
    "$AGENTRL" sft configs/sft/tiny_cpu.yaml model.path="$BASE" "data.train_files=[$DATA/code-sft.jsonl]" \
      sft.run_dir="$OUT/sft" sft.max_steps="$SFT_STEPS" sft.epochs=100 sft.log_freq=10 \
      actor.lr="$SFT_LR" actor.warmup_steps=$(( SFT_STEPS / 10 ))
  fi
fi

SANDBOX_ARGS=(tools.tools_kwargs.python.sandbox_url="$SANDBOX_URL" reward.sandbox_url="$SANDBOX_URL")

echo "== [$NAME] GRPO: $STEPS steps x $BATCH prompts x $GROUP episodes from $START"
"$AGENTRL" train "$CONFIG" model.path="$START" "${SANDBOX_ARGS[@]}" \
  "data.train_files=[$DATA/code-train.jsonl]" "data.val_files=[$DATA/code-heldout.jsonl]" \
  data.train_batch_size="$BATCH" actor.ppo_mini_batch_size="$BATCH" rollout.n="$GROUP" \
  data.val_batch_size="$VAL_TASKS" trainer.test_freq="$TEST_FREQ" \
  trainer.total_steps="$STEPS" trainer.save_freq="$STEPS" trainer.run_dir="$OUT/rl" "$@"

echo "== [$NAME] held-out eval on $N_EVAL tasks -> $OUT/eval"
COMPARE_ARGS=()
if [[ $COMPARE == 1 ]]; then COMPARE_ARGS=(--compare "$START" --compare-name start); fi
"$AGENTRL" eval --model "$OUT/rl/final_model" --name grpo --suite "$DATA/code-heldout.jsonl" --config "$CONFIG" \
  -o "${SANDBOX_ARGS[0]}" --sandbox-url "$SANDBOX_URL" --out "$OUT/eval" "${COMPARE_ARGS[@]}"

echo "== [$NAME] done: metrics $OUT/rl/metrics.jsonl, eval $OUT/eval"
