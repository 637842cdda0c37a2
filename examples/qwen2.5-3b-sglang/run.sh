#!/usr/bin/env bash
# GRPO of Qwen2.5-3B-Instruct on the calc suite, one 8-GPU node: SGLang rollout servers on GPUs 0-3, a Ray +
# FSDP2 trainer (4 ranks, bf16 compute, fp32 master weights) on GPUs 4-7, the calculator as an HTTP tool
# service. GPU only: it cannot run on the CPU test machines, and only DRY_RUN=1 has ever run (see README.md).
#
#   bash examples/qwen2.5-3b-sglang/run.sh                        # the full run (configs/calc_qwen2.5-3b_sglang.yaml)
#   DRY_RUN=1 bash examples/qwen2.5-3b-sglang/run.sh              # print every command + the resolved config
#   STEPS=20 bash examples/qwen2.5-3b-sglang/run.sh actor.lr=2e-6 # extra args: `agentrl train` overrides
#
# Environment knobs (defaults in brackets):
#   MODEL_ID [Qwen/Qwen2.5-3B-Instruct]  downloaded to MODEL_PATH when that folder has no config.json
#   MODEL_PATH [runs/models/Qwen2.5-3B-Instruct]  local HF dir shared by the servers and the trainer
#   SGLANG_GPUS [0,1,2,3]  NUM_SERVERS [4]  TP [1]   rollout servers (NUM_SERVERS x TP GPUs)
#   TRAIN_GPUS [4,5,6,7]                              FSDP ranks, one per GPU (actor.world_size)
#   BASE_PORT [30000]  TOOLS_PORT [8001]  MEM_FRACTION [0.7]
#   STEPS [150]  N_TRAIN [20000]  N_EVAL [200]  OUT [runs/examples/qwen2.5-3b-sglang]
#   ENGINE_TOKEN_FILE [OUT/engine.token, a random key written when missing]  the servers' API key (SGLang's
#               --api-key, handed over in a private --config file, not on the command line); the trainer sends it
#   RAY_ADDRESS [unset: start a head on this node with the TRAIN_GPUS, stopped on exit; "auto" or host:port:
#               join a running cluster, e.g. after `ray start --head --port 6379` here and
#               `ray start --address HEAD_IP:6379 --num-gpus 8` on each worker node]
# Multi-node: run the SGLang servers wherever there are free GPUs and pass their URLs with URLS=url1,url2,...
# and their key file with ENGINE_TOKEN_FILE (`launch-sglang --host 0.0.0.0` needs --token-file); the run dir
# must then be on a filesystem every server can read: weight sync goes through disk.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
AGENTRL=agentrl PYTHON=python3 RAY=ray
if [[ -x .venv/bin/agentrl ]]; then AGENTRL=.venv/bin/agentrl PYTHON=.venv/bin/python RAY=.venv/bin/ray; fi

CONFIG=configs/calc_qwen2.5-3b_sglang.yaml
MODEL_ID=${MODEL_ID:-Qwen/Qwen2.5-3B-Instruct}
MODEL_PATH=${MODEL_PATH:-runs/models/Qwen2.5-3B-Instruct}
SGLANG_GPUS=${SGLANG_GPUS:-0,1,2,3}
NUM_SERVERS=${NUM_SERVERS:-4}
TP=${TP:-1}
TRAIN_GPUS=${TRAIN_GPUS:-4,5,6,7}
BASE_PORT=${BASE_PORT:-30000}
TOOLS_PORT=${TOOLS_PORT:-8001}
MEM_FRACTION=${MEM_FRACTION:-0.7}
STEPS=${STEPS:-150}
N_TRAIN=${N_TRAIN:-20000}
N_EVAL=${N_EVAL:-200}
OUT=${OUT:-runs/examples/qwen2.5-3b-sglang}
DRY_RUN=${DRY_RUN:-0}
DATA=$OUT/data
WORLD_SIZE=$(awk -F, '{print NF}' <<< "$TRAIN_GPUS")

run() {  # run a command, or only print it under DRY_RUN=1
  if [[ $DRY_RUN == 1 ]]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

PIDS=()
STARTED_RAY=0
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $STARTED_RAY == 1 ]]; then "$RAY" stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

# 1. Weights: one local copy, read by the SGLang servers and by the trainer (model.path).
if [[ ! -f $MODEL_PATH/config.json ]]; then
  echo "== download $MODEL_ID -> $MODEL_PATH"
  run "$PYTHON" -c 'import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir=sys.argv[2])' \
    "$MODEL_ID" "$MODEL_PATH"
fi

# 2. Tasks (the same generators as the CPU examples; held-out tasks never occur in training).
run "$AGENTRL" data make calc --split train --n "$N_TRAIN" "$DATA/calc-train.jsonl" --seed 0
run "$AGENTRL" data make calc --split heldout --n "$N_EVAL" "$DATA/calc-heldout.jsonl" --seed 0

# The servers' API key: every request but /health must carry it (the trainer's engine.token_file).
ENGINE_TOKEN_FILE=${ENGINE_TOKEN_FILE:-$OUT/engine.token}
if [[ ! -s $ENGINE_TOKEN_FILE ]]; then
  mkdir -p "$(dirname "$ENGINE_TOKEN_FILE")"
  (umask 077; "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$ENGINE_TOKEN_FILE")
fi

# 3. SGLang servers, one per TP group of SGLANG_GPUS (memory saver, explicit mem-fraction, loopback; the trainer
#    does not release their memory, so it trains on GPUs of its own); `launch-sglang` waits for every /health and
#    writes the URLs file. It runs under a SIGTERM handler so that the EXIT trap's kill stops the servers it
#    started as well.
if [[ -z ${URLS:-} ]]; then
  mkdir -p "$OUT"
  rm -f "$OUT/sglang_urls.txt"
  LAUNCH=(engine launch-sglang --model "$MODEL_PATH" --num-servers "$NUM_SERVERS" --tp "$TP"
          --gpus "$SGLANG_GPUS" --base-port "$BASE_PORT" --mem-fraction-static "$MEM_FRACTION"
          --urls-file "$OUT/sglang_urls.txt" --token-file "$ENGINE_TOKEN_FILE")
  if [[ $DRY_RUN == 1 ]]; then
    "$AGENTRL" "${LAUNCH[@]}" --dry-run
    URLS=$(seq -s, -f "http://127.0.0.1:%g" "$BASE_PORT" $(( BASE_PORT + NUM_SERVERS - 1 )))
  else
    echo "== SGLang: $NUM_SERVERS server(s) x TP $TP on GPUs $SGLANG_GPUS (log $OUT/sglang.log)"
    "$PYTHON" -c 'import signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds launch-sglang, which stops its servers
from agentrl.cli import main
sys.exit(main(sys.argv[1:]))' "${LAUNCH[@]}" > "$OUT/sglang.log" 2>&1 &
    PIDS+=($!)
    until [[ -s $OUT/sglang_urls.txt ]]; do
      kill -0 "${PIDS[-1]}" 2>/dev/null || { echo "SGLang launch failed:"; tail -50 "$OUT/sglang.log"; exit 1; }
      sleep 5
    done
    URLS=$(paste -sd, "$OUT/sglang_urls.txt")
  fi
fi
echo "== SGLang servers: $URLS"

# 4. The calculator as an HTTP tool service (the config's tools.services points at 127.0.0.1:TOOLS_PORT).
if [[ $DRY_RUN == 1 ]]; then
  run "$AGENTRL" tools serve agentrl.tools.builtin.calculator:calculator --port "$TOOLS_PORT"
else
  "$AGENTRL" tools serve agentrl.tools.builtin.calculator:calculator --port "$TOOLS_PORT" > "$OUT/tools.log" 2>&1 &
  PIDS+=($!)
  "$PYTHON" -c 'import sys, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen(sys.argv[1] + "/health", timeout=2); break
    except OSError: time.sleep(0.5)
else: sys.exit("tool service did not start; see " + sys.argv[2])' "http://127.0.0.1:$TOOLS_PORT" "$OUT/tools.log"
fi

# 5. Ray: the trainer joins a cluster (trainer.ray_address: auto). Start a head with the training GPUs only.
if [[ -z ${RAY_ADDRESS:-} ]]; then
  run env CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" "$RAY" start --head --num-gpus "$WORLD_SIZE" --disable-usage-stats
  STARTED_RAY=$(( DRY_RUN == 1 ? 0 : 1 ))
  RAY_ADDRESS=auto
fi

# 6. GRPO. Every step: rollouts on the servers -> FSDP update -> HF checkpoint in OUT/rl/weights ->
#    /update_weights_from_disk on every server. Rerunning resumes from OUT/rl/checkpoints.
TRAIN=(train "$CONFIG" model.path="$MODEL_PATH" engine.backend=sglang "engine.urls=[$URLS]"
       engine.token_file="$ENGINE_TOKEN_FILE"
       "tools.services=[{url: \"http://127.0.0.1:$TOOLS_PORT\", name: calculator, timeout_s: 10.0, retries: 2}]"
       "data.train_files=[$DATA/calc-train.jsonl]" "data.val_files=[$DATA/calc-heldout.jsonl]"
       actor.world_size="$WORLD_SIZE" actor.num_gpus_per_worker=1 trainer.ray_address="$RAY_ADDRESS"
       trainer.total_steps="$STEPS" trainer.run_dir="$OUT/rl" "$@")
if [[ $DRY_RUN == 1 ]]; then
  run "$AGENTRL" "${TRAIN[@]}"
  echo "== resolved config:"
  "$AGENTRL" "${TRAIN[@]}" --print-config
  exit 0
fi
"$AGENTRL" "${TRAIN[@]}"

# 7. Held-out eval of the trained policy (run_dir/final_model) against the starting checkpoint, on the first
#    training GPU (free again) with the transformers engine in bf16 and the calculator in-process.
CUDA_VISIBLE_DEVICES=${TRAIN_GPUS%%,*} "$AGENTRL" eval --model "$OUT/rl/final_model" --name grpo --compare "$MODEL_PATH" --compare-name base \
  --suite "$DATA/calc-heldout.jsonl" --config "$CONFIG" -o engine.backend=local -o engine.device=cuda \
  -o engine.dtype=bfloat16 -o tools.services=[] -o tools.builtin=[calculator] --out "$OUT/eval"
