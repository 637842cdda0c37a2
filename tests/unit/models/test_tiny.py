"""The offline tiny model: loadable by transformers, exact tokenizer, Qwen2.5-style tool template, deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from agentrl.cli import main
from agentrl.models.tiny import (
    CONTROL_TOKENS,
    MAX_POSITION_EMBEDDINGS,
    SIZES,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    build_tiny_model,
    count_parameters,
)

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]

TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a math assistant."},
    {"role": "user", "content": "What is 12*7 and 3+4?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*7"}}},
        {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "3+4"}'}},
    ]},
    {"role": "tool", "content": "84"},
    {"role": "tool", "content": "7"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"name": "calculator", "arguments": {"expression": "84+7"}}]},
    {"role": "tool", "content": "91"},
    {"role": "assistant", "content": "The answers are <answer>84</answer> and 7."},
    {"role": "user", "content": "Thanks!\nBye."},
    {"role": "assistant", "content": "Bye."},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_loads_with_auto_classes_and_runs_forward_and_generate(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = model.config
    assert config.model_type == "qwen2" and config.tie_word_embeddings and config.use_cache
    assert config.vocab_size == len(tokenizer) == VOCAB_SIZE
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.model_max_length == config.max_position_embeddings == MAX_POSITION_EMBEDDINGS
    assert model.dtype == torch.float32

    ids = encode(tokenizer, render(tokenizer, [{"role": "user", "content": "What is 2+2?"}],
                                   add_generation_prompt=True))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer))
    assert torch.isfinite(logits).all()

    generation = GenerationConfig.from_pretrained(tiny_model_dir)
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert generation.eos_token_id == [im_end, eot] and generation.pad_token_id == eot
    assert generation.do_sample and generation.bos_token_id is None
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] > len(ids) and out[0, : len(ids)].tolist() == ids


def test_param_counts():
    def n_params(size: str) -> int:
        config = Qwen2Config(vocab_size=VOCAB_SIZE, tie_word_embeddings=True, **vars(SIZES[size]))
        with torch.device("meta"):
            return count_parameters(Qwen2ForCausalLM(config))

    assert 0.5e6 <= n_params("tiny") < n_params("tiny3") <= 1.5e6
    assert 5e6 <= n_params("small") <= 10e6


def test_tiny_model_weights_match_count(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert 0.5e6 <= count_parameters(model) <= 1.5e6
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_special_and_control_tokens_are_single_ids_at_the_end(tokenizer):
    ids = [encode(tokenizer, token) for token in SPECIAL_TOKENS + CONTROL_TOKENS]
    assert all(len(i) == 1 for i in ids), ids
    flat = [i[0] for i in ids]
    assert flat == list(range(VOCAB_SIZE - len(flat), VOCAB_SIZE))
    # Inside text, too: no merges across a special token.
    text = 'x<tool_call>\n{"a": 1}\n</tool_call>y<|im_end|>\n'
    assert tokenizer.convert_ids_to_tokens(encode(tokenizer, text)).count("<tool_call>") == 1


def test_skip_special_tokens_keeps_tool_and_think_tags(tokenizer):
    text = "<|im_start|>assistant\n<think>\nhmm\n</think>\n<tool_call>\n{}\n</tool_call><|im_end|>\n<|endoftext|>"
    decoded = tokenizer.decode(encode(tokenizer, text), skip_special_tokens=True)
    assert decoded == "assistant\n<think>\nhmm\n</think>\n<tool_call>\n{}\n</tool_call>\n"


@pytest.mark.parametrize("text", [
    "Hello, world!",
    " leading space and trailing space ",
    "line one\nline two\r\n\n\n\ttabbed   spaces",
    '{"name": "calculator", "arguments": {"expression": "(12 + 7) * 3 / 4"}}',
    "café naïve Zürich 日本語 Ελλάδα 🙂👍🏽 ∑ x² €",
    "def f(x):\n    return x ** 2  # comment\n",
    "zqxjv unseen-wordish tokens_with_underscores AND CAPS 1234567890 -3.14159e10",
    "<answer>42</answer>",
])
def test_encode_decode_round_trip(tokenizer, text):
    ids = encode(tokenizer, text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(encode(tokenizer, "12*7=84 and 2024"))
    assert [t for t in tokens if t.lstrip("Ġ").isdigit()] == ["1", "2", "7", "8", "4", "2", "0", "2", "4"]


def test_vocabulary_compresses_agent_text(tokenizer):
    # A trained BPE, not bytes: common words and JSON keys are single tokens.
    for word in ["calculator", "Ġthe", "arguments", "expression"]:
        assert word in tokenizer.get_vocab(), word
    call = json.dumps({"name": "calculator", "arguments": {"expression": "12*7"}})
    assert len(encode(tokenizer, call)) < len(call) / 2


def test_template_default_system_prompt_and_generation_prompt(tokenizer):
    text = render(tokenizer, [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not render(tokenizer, [{"role": "user", "content": "Hi"}]).endswith("<|im_start|>assistant\n")


def test_template_renders_tools_calls_and_grouped_responses(tokenizer):
    text = render(tokenizer, TOOL_CONVERSATION, tools=TOOLS)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a math assistant.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system
    # Dict and JSON-string arguments render the same way; the `function` wrapper is optional.
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n'
            "</tool_call><|im_end|>\n") in text
    assert ("<|im_start|>user\n<tool_response>\n84\n</tool_response>\n<tool_response>\n7\n</tool_response>"
            "<|im_end|>\n") in text
    assert ('<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "calculator", "arguments": '
            '{"expression": "84+7"}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>assistant\nBye.<|im_end|>\n")
    assert text.count("<|im_start|>user") == 4


def test_template_matches_qwen25_template_when_system_prompt_given(tokenizer, qwen2_tokenizer_dir):
    """Same bytes as the real Qwen2.5 tool template (dict arguments; Qwen's template has no string support)."""
    qwen_template = (qwen2_tokenizer_dir / "chat_template.jinja").read_text()
    messages = [m for m in TOOL_CONVERSATION if not (m["role"] == "assistant" and m.get("tool_calls")
                                                     and any(isinstance(c.get("function", c)["arguments"], str)
                                                             for c in m["tool_calls"]))]
    for tools in (TOOLS, None):
        for gen in (True, False):
            ours = render(tokenizer, messages[:-2], tools=tools, add_generation_prompt=gen)
            theirs = render(tokenizer, messages[:-2], tools=tools, add_generation_prompt=gen,
                            chat_template=qwen_template)
            assert ours == theirs


def test_template_content_parts_and_unknown_role(tokenizer):
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "<|im_start|>user\nab<|im_end|>\n" in render(tokenizer, parts)
    with pytest.raises(Exception, match="unknown message role"):
        render(tokenizer, [{"role": "robot", "content": "x"}])


def _turn_boundaries(messages: list[dict]) -> list[int]:
    """Prefix lengths that end at a turn boundary (consecutive tool messages share one user turn)."""
    return [k for k in range(1, len(messages) + 1)
            if k == len(messages) or not (messages[k]["role"] == "tool" and messages[k - 1]["role"] == "tool")]


@pytest.mark.parametrize("tools", [TOOLS, None])
@pytest.mark.parametrize("with_system", [True, False])
def test_template_is_append_only_in_tokens(tokenizer, tools, with_system):
    messages = TOOL_CONVERSATION if with_system else TOOL_CONVERSATION[1:]
    full_ids = encode(tokenizer, render(tokenizer, messages, tools=tools))
    for k in _turn_boundaries(messages):
        prefix_ids = encode(tokenizer, render(tokenizer, messages[:k], tools=tools))
        assert full_ids[: len(prefix_ids)] == prefix_ids, f"prefix of {k} messages is not a token prefix"
        if k < len(messages) and messages[k]["role"] == "assistant":
            prompt_ids = encode(tokenizer, render(tokenizer, messages[:k], tools=tools, add_generation_prompt=True))
            assert full_ids[: len(prompt_ids)] == prompt_ids, f"generation prompt after {k} messages"


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def test_build_is_deterministic_and_seed_changes_only_weights(tiny_model_dir, tmp_path):
    again = _files(build_tiny_model(tmp_path / "again", size="tiny", seed=0))
    assert again == _files(tiny_model_dir)
    other = _files(build_tiny_model(tmp_path / "other", size="tiny", seed=1))
    assert other["model.safetensors"] != again["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in again.items() if k != "model.safetensors"}


def test_unknown_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        build_tiny_model(tmp_path, size="huge")


def test_cli_init_model(tmp_path, capsys):
    assert main(["init-model", str(tmp_path / "m"), "--size", "tiny", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "parameters:" in out and "model.safetensors" in out and "<|im_end|>=" in out
    assert AutoTokenizer.from_pretrained(tmp_path / "m").eos_token == "<|im_end|>"


def test_text_is_nfc_normalised_like_qwen2(tokenizer):
    # transformers loads qwen2-type tokenizers with Qwen2's NFC normaliser; decomposed accents come back composed.
    assert tokenizer.decode(encode(tokenizer, "cafe\u0301")) == "caf\u00e9"


def test_the_model_files_are_readable_by_everyone(tiny_model_dir):
    """safetensors writes weights 0600; a model another account (a server, a colleague) loads needs 0644."""
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in tiny_model_dir.iterdir()} == \
        {f.name: "0o644" for f in tiny_model_dir.iterdir()}
