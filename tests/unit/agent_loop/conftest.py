from __future__ import annotations

import pytest
from scripted_engine import add, broken_service, echo, lookup, repeat, slow


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def qwen2_tokenizer(qwen2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen2_tokenizer_dir)


@pytest.fixture(params=["tiny", "qwen2"])
def tokenizer(request):
    """Both the project's tiny tokenizer and the real Qwen2 tokenizer with the Qwen2.5 tool template."""
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture
def registry():
    from agentrl.tools import ToolRegistry

    return ToolRegistry.from_functions([add, echo, repeat, lookup, broken_service, slow])
