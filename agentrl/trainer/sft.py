"""Supervised fine-tuning (cold start) on multi-turn tool transcripts, through the same FSDP worker as RL.

The masking matches RL exactly: a transcript is tokenized with the chat template the agent loop uses, and only
the tokens the policy would have sampled get loss_mask = 1 -- an assistant message's content (tool-call blocks
included) and its end-of-turn token. System, user and tool tokens, the generation prompt
(`<|im_start|>assistant\\n`) and the glue after the end-of-turn token (Qwen's `\\n`) get 0, as they get
response_mask = 0 in RL.

    agentrl sft configs/sft/tiny_cpu.yaml data.train_files=[demos.jsonl] model.path=runs/m
    agentrl sft configs/sft/tiny_cpu.yaml ... --check     # check the model and every demo row; no training

Demonstration rows (JSONL): {"messages": [OpenAI messages], "tools": [OpenAI function schemas] | null}
(`agentrl data demos SUITE OUT.jsonl` writes them).

With `actor.lora` only the adapters train; the model saved is the base with the adapters merged in (what `agentrl
train` and `eval` take as model.path), and `<output_dir>/adapter/` holds the adapter in peft's format.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from pydantic import Field

from agentrl.config import ConfigModel
from agentrl.data.demos import load_demos, tokenize_demos
from agentrl.errors import UserError
from agentrl.trainer.config import ActorConfig, ModelConfig

ADAPTER_DIR = "adapter"  # under the output dir, with actor.lora


class SFTDataConfig(ConfigModel):
    train_files: list[str] = Field(default_factory=list)  # JSONL rows {"messages": [...], "tools": [...]}
    max_length: int = 2048  # transcripts longer than this (in tokens) are skipped and counted
    shuffle: bool = True


class SFTRunConfig(ConfigModel):
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(16, ge=1)  # transcripts per optimizer step
    max_steps: int | None = Field(None, ge=1)  # stop early after this many optimizer steps
    run_dir: str = "runs/sft"  # sft_metrics.jsonl, config.yaml
    output_dir: str | None = None  # where the fine-tuned HF model is saved; None: <run_dir>/model
    seed: int = 0
    log_freq: int = 10  # console line every N steps (metrics.jsonl gets every step)
    use_ray: bool = False  # True: FSDP ranks as Ray actors (actor.world_size of them); False: one in-process rank


class SFTConfig(ConfigModel):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)
    # SFT's defaults apply when the config has no `actor:` section; a section it has starts from ActorConfig's
    actor: ActorConfig = Field(default_factory=lambda: ActorConfig(lr=1e-3, weight_decay=0.0, warmup_steps=10))
    sft: SFTRunConfig = Field(default_factory=SFTRunConfig)


class SFTDataError(UserError, ValueError):
    """Demonstrations that cannot be trained on as configured."""


def run_sft(cfg: SFTConfig) -> dict:
    """Fine-tune `cfg.model.path` on the demonstrations; saves the model and returns the final metrics.

    Every run starts clean: sft_metrics.jsonl and config.yaml in `sft.run_dir` are rewritten (SFT does not resume).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.config import save_config
    from agentrl.console import quiet_third_party
    from agentrl.files import make_readable
    from agentrl.trainer.batch import sft_batch
    from agentrl.trainer.console import run_header, sft_line
    from agentrl.trainer.worker import WorkerGroup, start_ray

    quiet_third_party()
    run_dir = Path(cfg.sft.run_dir)
    out_dir = Path(cfg.sft.output_dir or run_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or cfg.model.path)
    sequences, skipped = tokenize_demos(tokenizer, load_demos(cfg.data.train_files), cfg.data.max_length)
    if not sequences:
        raise SFTDataError(f"every SFT transcript in {', '.join(cfg.data.train_files)} is longer than "
                           f"data.max_length={cfg.data.max_length} tokens; raise data.max_length")
    steps_per_epoch = max(1, len(sequences) // cfg.sft.batch_size)
    total = steps_per_epoch * cfg.sft.epochs
    if cfg.sft.max_steps is not None:
        total = min(total, cfg.sft.max_steps)
    print(run_header("sft", {
        "run dir": run_dir, "model": cfg.model.path,
        "transcripts": f"{len(sequences)} ({skipped} skipped: longer than {cfg.data.max_length} tokens)",
        "trained tokens": sum(sum(m) for _, m in sequences), "steps": total,
        "batch": f"{cfg.sft.batch_size} transcripts", "world size": cfg.actor.world_size if cfg.sft.use_ray else 1}),
        flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir, path_keys=("model.path", "model.tokenizer_path", "data.train_files"))

    started_ray = start_ray(log_to_driver=False) if cfg.sft.use_ray else False
    rng = random.Random(cfg.sft.seed)
    metrics: dict = {}
    step, start = 0, time.perf_counter()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    workers = None
    try:
        workers = WorkerGroup(cfg.model, cfg.actor, total_steps=total, seed=cfg.sft.seed, use_ray=cfg.sft.use_ray)
        with open(run_dir / "sft_metrics.jsonl", "w") as log:
            while step < total:
                order = list(range(len(sequences)))
                if cfg.data.shuffle:
                    rng.shuffle(order)
                for k in range(steps_per_epoch):
                    if step >= total:
                        break
                    chosen = [sequences[i] for i in order[k * cfg.sft.batch_size:(k + 1) * cfg.sft.batch_size]]
                    metrics = workers.update_sft(sft_batch(chosen, pad))
                    step += 1
                    metrics = {"step": step, "elapsed_s": round(time.perf_counter() - start, 2), **metrics}
                    log.write(json.dumps(metrics) + "\n")
                    log.flush()
                    if step % cfg.sft.log_freq == 0 or step == total:
                        print(sft_line(step, total, metrics, time.perf_counter() - start), flush=True)
        state = workers.full_state_dict()  # under actor.lora: the adapters merged into the base weights
        if cfg.actor.lora is not None:
            workers.save_adapter(out_dir / ADAPTER_DIR)
    finally:
        if workers is not None:
            workers.shutdown()
        if started_ray:
            import ray

            ray.shutdown()
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path)
    model.load_state_dict(state)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if hasattr(model, "generation_config") and model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)
    make_readable(out_dir)
    adapter = f" (its LoRA adapter in {out_dir / ADAPTER_DIR})" if cfg.actor.lora is not None else ""
    print(f"sft: saved the fine-tuned model to {out_dir}{adapter}", flush=True)
    return {**metrics, "output_dir": str(out_dir), "skipped": skipped, "num_transcripts": len(sequences)}
