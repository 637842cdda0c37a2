"""The TRL side of `agentrl bench step --vs-trl`: TRL's GRPOTrainer on the bench's model, tasks and batch.

    python -m agentrl.trainer.bench_trl MODEL TASKS.jsonl OUT_DIR STEPS N PROMPTS MAX_NEW_TOKENS SEED

`agentrl.trainer.step_bench.run_trl` runs it in a subprocess of its own (its own torch threads, as the agentrl
side's `agentrl train` has) and reads the last line, `TRL_RESULT {"times": [s per optimizer step, warm-up
included], "threads": torch threads, "num_tokens": [TRL's token counts]}`. The settings match the agentrl side:
N episodes per prompt, PROMPTS prompts per step, at most MAX_NEW_TOKENS per turn, up to 2 tool calls, lr 1e-5,
loss-side KL 0.001, constant schedule, fp32 on CPU. Needs TRL (`pip install 'agentrl[trl]'`); agentrl never
imports this module otherwise.
"""

from __future__ import annotations

import argparse
import json
import time


def multiply(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return str(int(a) * int(b))


def reward(completions, answer, **kw) -> list[float]:
    """1.0 when the final message is exactly the task's answer, as the agentrl side's exact_match reward."""
    def text(c):
        return c[-1]["content"] if isinstance(c, list) else c
    return [1.0 if text(c).strip() == a else 0.0 for c, a in zip(completions, answer)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentrl.trainer.bench_trl")
    for name in ("model", "tasks", "out"):
        parser.add_argument(name)
    for name in ("steps", "n", "prompts", "max_new", "seed"):
        parser.add_argument(name, type=int)
    a = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Timer(TrainerCallback):
        """Seconds of each optimizer step, its generation, reference and update included."""

        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    tok = AutoTokenizer.from_pretrained(a.model)
    with open(a.tasks) as f:
        rows = [json.loads(line) for line in f]
    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["reward"]["ground_truth"]} for r in rows])
    timer = Timer()
    args = GRPOConfig(output_dir=a.out, per_device_train_batch_size=a.n * a.prompts, num_generations=a.n,
                      max_completion_length=a.max_new, max_tool_calling_iterations=2, learning_rate=1e-5, beta=0.001,
                      max_steps=a.steps, use_cpu=True, bf16=False, logging_steps=1, report_to=[], save_strategy="no",
                      seed=a.seed, temperature=1.0, lr_scheduler_type="constant", disable_tqdm=True)
    trainer = GRPOTrainer(model=a.model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          tools=[multiply], callbacks=[timer])
    trainer.train()
    tokens = [h.get("num_tokens") for h in trainer.state.log_history if "num_tokens" in h]
    print("TRL_RESULT " + json.dumps({"times": timer.times, "threads": torch.get_num_threads(), "num_tokens": tokens}))


if __name__ == "__main__":
    main()
