"""A verifiers taskset built in code for the adapter's tests (no download): prompts and one `@reward` that scores
the answer's length, so the expected reward can be computed from the recorded tokens; the third task's reward
function raises."""

import verifiers.v1 as vf
from verifiers.v1.utils.decorators import reward


def length_score(text: str) -> float:
    return 1.0 if len(text) % 2 == 0 else 0.25


class LengthTask(vf.Task):
    @reward
    async def even_length(self, trace) -> float:
        if self.data.prompt == "Break the rubric.":
            raise ValueError("the rubric broke")
        return length_score(str(trace.last_message.content or ""))


class LengthTaskset(vf.Taskset[LengthTask]):
    def load(self):
        for prompt in ("What is 1 + 2?", "Name a colour.", "Break the rubric."):
            yield LengthTask(vf.TaskData(prompt=prompt, system_prompt="Answer briefly."), self.config.task)


__all__ = ["LengthTaskset"]
