"""The value model of classic PPO and its FSDP2 ranks.

The critic is an HF causal-LM body with a scalar head (`AutoModelForTokenClassification`, one label,
dropout off): the body comes from `critic.model.path` or, by default, the policy's weights; the head is drawn
from the seeded initializer. It has its own optimizer, LR schedule, micro-batching and checkpoint directory
(`critic/`, `critic_rank{r}.pt`); everything but the model and the value loss is `FSDPWorker`'s.

Values use the layout of `agentrl.trainer.batch`: `values_B_L[:, p]` is the head's output at position p - 1,
the state the policy saw when it sampled token p, so a value sits on the same position as that token's logprob
and reward. Position 0 and padding read 0.

    values = critic.compute_values(batch)                    # before any update: GAE's V and the clip anchor
    metrics = critic.update_critic(batch, mini_batch_size=.., epochs=..)   # needs values, returns
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from agentrl.trainer.algos import masked_sum, value_loss
from agentrl.trainer.batch import materialize, mini_batches, scatter_rows
from agentrl.trainer.checkpoint import CRITIC_RANK_FILE, CRITIC_SHARDS_DIR
from agentrl.trainer.config import ModelConfig
from agentrl.trainer.fsdp import FSDPGroup, FSDPWorker


class CriticWorker(FSDPWorker):
    """One FSDP2 rank of the value model. Use through `CriticGroup`."""

    SHARDS_DIR = CRITIC_SHARDS_DIR
    RANK_FILE = CRITIC_RANK_FILE
    TOKEN_WEIGHTED = ("vf_clipfrac", "vpred_mean")

    def _build_models(self):
        from transformers import AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        # Errors only: the load report would list the value head as "missing", which a fresh head is meant to be.
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            model = self._load(trainable=True, auto_class=AutoModelForTokenClassification, num_labels=1)
        finally:
            hf_logging.set_verbosity(verbosity)
        # No dropout (the head's default is 0.1): the update must regress the function compute_values evaluated.
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return model

    def _values(self, mb: TensorDict):
        """Values [b, w] aligned with input_ids: the head at position p - 1 gives the value of token p."""
        ids = mb["input_ids"].to(self.device)
        with warnings.catch_warnings():
            # The head's [b, w, 1] output is a view of its matmul; it is only sliced out of place here, so FSDP's
            # warning about in-place ops on a view output does not apply.
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
            head = self.model(input_ids=ids, use_cache=False).logits[:, :-1, 0]
        return F.pad(head, (1, 0))

    @torch.no_grad()
    def compute_values(self, micro_batches: list[TensorDict]) -> list[torch.Tensor]:
        """Per micro-batch values [b, w] on CPU (float32), 0 on padding."""
        self.model.eval()
        out = []
        for mb in micro_batches:
            values = self._values(mb).float().cpu()
            real = (torch.arange(values.shape[1]) < mb["seq_lens"][:, None]).float()
            out.append(values * real)
        return out

    def _value_loss(self, mb: TensorDict, num_tokens: int, num_seqs: int, _temperature: float):
        c = self.cfg
        vpreds = self._values(mb)
        mask = mb["loss_mask"].to(self.device)
        loss, clipfrac = value_loss(vpreds, mb["returns"].to(self.device), mb["values"].to(self.device), mask,
                                    cliprange_value=c.cliprange_value, agg_mode=c.loss_agg_mode,
                                    num_tokens=num_tokens, num_seqs=num_seqs, scale_factor=c.loss_scale_factor)
        vpred_mean = masked_sum(vpreds.detach(), mask) / mask.sum().clamp_min(1)
        return loss, {"vf_loss": loss.detach(), "vf_clipfrac": clipfrac, "vpred_mean": vpred_mean}

    def update_critic(self, mini_batches: list[list[TensorDict]], counts: list[tuple[int, int]]) -> dict[str, float]:
        """One optimizer step per mini-batch of the clipped value loss; the LR schedule advances once.
        Returns mini-batch averages of vf_loss, vf_clipfrac, vpred_mean, grad_norm, plus lr, optimizer_steps and
        skipped_steps."""
        return self._train(self._value_loss, mini_batches, counts, 1.0)


class CriticGroup(FSDPGroup):
    """The critic's ranks. `model` is the value model's HF directory (the policy's unless `critic.model.path`
    names another)."""

    worker_cls = CriticWorker

    def compute_values(self, batch: TensorDict) -> torch.Tensor:
        """Values [B, L] aligned with batch["input_ids"] under the current critic."""
        plan = self._plan(batch, None)
        parts = self._call("compute_values", [(mbs,) for mbs in materialize(batch, plan)])
        size, width = batch["input_ids"].shape
        return scatter_rows(parts, plan, size, width)

    def update_critic(self, batch: TensorDict, *, mini_batch_size: int, epochs: int = 1, shuffle: bool = True,
                      seed: int = 0) -> dict[str, float]:
        """`epochs` x mini-batches of `mini_batch_size` trajectories; needs values and returns in `batch`."""
        steps = mini_batches(batch.batch_size[0], mini_batch_size, epochs=epochs, shuffle=shuffle, seed=seed)
        return self._dispatch_train("update_critic", batch, steps, "bucket")


def critic_model(policy: ModelConfig, path: str | None) -> ModelConfig:
    """The value model's ModelConfig: the policy's (dtype, precision, attention) with `path` when it is set."""
    return policy if not path else policy.model_copy(update={"path": path})


__all__ = ["CriticGroup", "CriticWorker", "critic_model"]
