"""SFT masking matches RL masking, and SFT actually fits demonstrations."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from agentrl.agent_loop.chat import ChatTemplate
from agentrl.config import load_config
from agentrl.data.demos import encode_transcript, load_demos
from agentrl.trainer.sft import SFTConfig, run_sft

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {
                                               "expression": {"type": "string"}}, "required": ["expression"]}}}]
CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12 * 7"}}}
MESSAGES = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 12 * 7?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
    {"role": "tool", "name": "calculator", "content": "84"},
    {"role": "tool", "name": "calculator", "content": "84"},
    {"role": "assistant", "content": "<answer>84</answer>"},
]


def _trained_text(tok, ids, mask) -> list[str]:
    spans, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            spans.append(tok.decode(cur))
            cur = []
    if cur:
        spans.append(tok.decode(cur))
    return spans


@pytest.mark.parametrize("which", ["tiny", "qwen2"])
def test_mask_covers_exactly_the_assistant_turns(which, tiny_model_dir, qwen2_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir if which == "tiny" else qwen2_tokenizer_dir)
    chat = ChatTemplate(tok, TOOLS)
    ids, mask = encode_transcript(chat, MESSAGES)
    assert ids == chat.encode(chat.render(MESSAGES))
    spans = _trained_text(tok, ids, mask)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    assert spans == [f"{call}\n{call}<|im_end|>", "<answer>84</answer><|im_end|>"]
    # the glue the model never samples (newline after <|im_end|>, next generation prompt) is not trained
    last = max(i for i, m in enumerate(mask) if m)
    assert ids[last] == chat.end_of_turn_id and all(m == 0 for m in mask[last + 1:])


def test_malformed_demo_rows_name_file_and_row(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"messages": MESSAGES}) + "\n" + json.dumps({"messages": "hi"}) + "\n")
    with pytest.raises(ValueError, match=r"d.jsonl:2: field 'messages'"):
        load_demos([str(p)])
    with pytest.raises(FileNotFoundError, match="agentrl data demos"):
        load_demos([str(tmp_path / "missing.jsonl")])


def test_sft_fits_demonstrations_and_saves_a_loadable_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    p = tmp_path / "demos.jsonl"
    p.write_text("\n".join(json.dumps({"messages": MESSAGES, "tools": TOOLS}) for _ in range(4)) + "\n")
    cfg = load_config(SFTConfig, "configs/sft/tiny_cpu.yaml", [
        f"model.path={tiny_model_dir}", f"data.train_files=[{p}]", "sft.epochs=8", "sft.batch_size=4",
        f"sft.run_dir={tmp_path / 'run'}", "actor.warmup_steps=0", "actor.lr=0.01", "sft.log_freq=100"])
    result = run_sft(cfg)
    lines = (tmp_path / "run" / "sft_metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["sft_loss"] for line in lines]
    assert len(losses) == 8
    assert losses[-1] < 0.5 * losses[0]
    model = AutoModelForCausalLM.from_pretrained(result["output_dir"])
    assert sum(p.numel() for p in model.parameters()) > 0
    assert (tmp_path / "run" / "config.yaml").is_file()
