# Sourced by the CPU examples after they cd to the repository root, with NAME set: the agentrl/python commands
# and every environment knob with its default (documented in each example's run.sh).
set -euo pipefail  # (already set by the callers; repeated so the file is safe on its own)
AGENTRL=agentrl PYTHON=python3
if [[ -x .venv/bin/agentrl ]]; then AGENTRL=.venv/bin/agentrl PYTHON=.venv/bin/python; fi

STEPS=${STEPS:-10}
N_TRAIN=${N_TRAIN:-512}
N_EVAL=${N_EVAL:-64}
N_DEMOS=${N_DEMOS:-2000}
SFT_STEPS=${SFT_STEPS:-300}
SFT_LR=${SFT_LR:-2e-3}
SIZE=${SIZE:-tiny}
BATCH=${BATCH:-4}
GROUP=${GROUP:-4}
TEST_FREQ=${TEST_FREQ:-5}
VAL_TASKS=${VAL_TASKS:-16}
COMPARE=${COMPARE:-1}
OUT=${OUT:-runs/examples/$NAME}
DATA=$OUT/data
CONFIG=examples/$NAME/config.yaml

# The example's base model (built once): the tiny model with the in-context copy circuit.
BASE=$OUT/base-model
build_base_model() {
  if [[ ! -f $BASE/config.json ]]; then
    echo "== [$NAME] model: agentrl init-model --size $SIZE --init copy"
    "$AGENTRL" init-model "$BASE" --size "$SIZE" --seed 0 --init copy
  fi
}
