from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import QWEN2_TOKENIZER_DIR  # noqa: E402


@pytest.fixture(scope="session")
def qwen2_tokenizer_dir() -> Path:
    """The real Qwen2 tokenizer with the Qwen2.5 tool-calling template (agentrl/models/qwen2_tokenizer)."""
    if not (QWEN2_TOKENIZER_DIR / "tokenizer_config.json").is_file():
        pytest.fail(f"{QWEN2_TOKENIZER_DIR} is missing from the checkout")
    return QWEN2_TOKENIZER_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2-architecture model + tokenizer, built once per test session (offline, seeded)."""
    from agentrl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(out, size="tiny", seed=0)
    return out


@pytest.fixture(scope="session")
def guessing_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with `helpers.guessing_weights`: its turns are short random numbers, so a guessing game's
    episodes end turns, get stepped and differ in reward."""
    import shutil

    from helpers import guessing_weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("guessing-model") / "model"
    shutil.copytree(tiny_model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(out)
    model.load_state_dict(guessing_weights(model, AutoTokenizer.from_pretrained(out)))
    model.save_pretrained(out)
    return out
