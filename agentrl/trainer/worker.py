"""The policy's FSDP2 ranks (`PolicyWorker`, one per Ray actor) and the group that drives them (`WorkerGroup`),
on the shared plumbing of `agentrl.trainer.fsdp`; the critic is `agentrl.trainer.critic`.

`PolicyWorker` adds to `FSDPWorker` the policy (and the frozen reference policy when a reference KL is needed;
under `actor.lora` the policy with its adapters switched off, `agentrl.trainer.lora`),
log-probabilities (the LM head only at loss tokens with `actor.fast_logprobs`) and the losses, per micro-batch
and summed over micro-batches by gradient accumulation (= the mini-batch objective):
    policy     `algos.ppo_objective`: the actor.policy_loss (rollout-correction weights on its token losses)
               + kl_loss_coef * agg(kl_penalty) - entropy_coeff * agg(entropy)
    SFT        agg(-logp) on loss-mask tokens (`update_sft`: the same micro-batching, for supervised
               fine-tuning on tool transcripts)
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from agentrl.inference.kv_batch import cache_kwarg
from agentrl.trainer.algos import (
    PolicyLossInputs,
    agg_loss,
    entropy_from_logits,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
    ppo_objective,
    rollout_is_weights,
)
from agentrl.trainer.batch import materialize, mini_batches, scatter_rows, split_shared_prefixes
from agentrl.trainer.config import ActorConfig, ModelConfig
from agentrl.trainer.fsdp import FSDPGroup, FSDPWorker, lr_factor, rank_threads, start_ray, unsharded
from agentrl.trainer.lora import adapters_off, hf_model


class PolicyWorker(FSDPWorker):
    """One FSDP2 rank of the policy. Use through `WorkerGroup` (which wraps it as a Ray actor when `use_ray`)."""

    TOKEN_WEIGHTED = ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower", "entropy", "kl")

    def __init__(self, model: ModelConfig, actor: ActorConfig, *, rank: int = 0, world_size: int = 1,
                 with_ref: bool = False, total_steps: int = 1, seed: int = 0, deterministic: bool = False):
        super().__init__(model, actor, rank=rank, world_size=world_size, total_steps=total_steps, seed=seed,
                         deterministic=deterministic)
        self.with_ref = with_ref
        self._reused_old: list[torch.Tensor] = []  # pi_old taken from training forwards (update_policy reuse_old)
        self._in_loss_correction: tuple | None = None  # (level, threshold, mode) of update_policy's is_correction

    @property
    def actor(self) -> ActorConfig:
        return self.cfg

    def _build_models(self):
        # Under LoRA the reference is the policy with its adapters switched off: no second copy of the weights.
        lora = self.actor.lora
        self.ref = self._load(trainable=False) if self.with_ref and lora is None else None
        return self._load(trainable=True, lora=lora)

    def _threads_per_rank(self) -> int | None:
        return self.cfg.num_threads_per_worker

    def broadcast_weights(self, target: dict) -> dict[str, float] | None:
        """Send the policy's weights to SGLang-protocol servers over a process group of rank 0 and the servers
        (`agentrl.inference.weight_broadcast`); collective like `full_state_dict`: every rank gathers, rank 0 sends
        and returns the metrics. `target`: urls, token_file, bucket_mb, flatten, timeout_s (the servers and the
        transfer) and weight_version, abort_all_requests (this update). The group stays open for the next update."""
        from agentrl.inference.weight_broadcast import WeightBroadcaster
        from agentrl.trainer.weight_sync import hf_tensors

        state_dict = self._engine_weights()  # under LoRA: merged, under the base model's names
        if self.rank != 0:
            return None
        where = {key: target[key] for key in ("urls", "token_file", "bucket_mb", "flatten", "timeout_s")}
        if getattr(self, "_broadcast_target", None) != where:  # first update, or the servers changed
            self.close_broadcast()
            self._broadcaster = WeightBroadcaster(
                target["urls"], master_address=self._broadcast_address(), token_file=target["token_file"],
                backend="nccl" if self.device.type == "cuda" else "gloo", bucket_bytes=int(target["bucket_mb"] * 2**20),
                timeout_s=target["timeout_s"], device=self.device, flatten=target["flatten"])
            self._broadcast_target = where
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        return self._broadcaster.send(hf_tensors(state_dict, tie_word_embeddings=tied),
                                      weight_version=target["weight_version"],
                                      abort_all_requests=target["abort_all_requests"])

    @staticmethod
    def _broadcast_address() -> str:
        """This rank's address as servers on other nodes reach it: the Ray node's, else loopback."""
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"

    def close_broadcast(self) -> None:
        sender = getattr(self, "_broadcaster", None)
        if sender is not None:
            sender.shutdown()
        self._broadcaster = self._broadcast_target = None

    def shutdown(self) -> None:
        self.close_broadcast()
        super().shutdown()

    # ---------------------------------------------------------------------------------------------- forward

    def _forward(self, module, mb: TensorDict, temperature: float, with_entropy: bool, *,
                 entropy_grad: bool = True):
        """Token logprobs [b, w] (and entropies) aligned with input_ids; position 0 is 0.

        With `actor.fast_logprobs` the LM head runs only where a loss token is predicted (the policy's own
        tokens; not the prompt, tool observations or padding), and the other positions read 0. The values at the
        loss tokens are the same as with the full head: it is the same matmul, row by row. `entropy_grad` False:
        the entropy is only reported (entropy_coeff 0), so it is computed without a graph."""
        ids = mb["input_ids"].to(self.device)
        if not self.actor.fast_logprobs:
            # Rows are right-padded: causal attention already keeps real tokens from seeing the padding after them.
            logits = module(input_ids=ids, use_cache=False).logits[:, :-1]
            logp = F.pad(logprobs_from_logits(logits, ids[:, 1:], temperature), (1, 0))
            ent = F.pad(self._entropy(logits, temperature, entropy_grad), (1, 0)) if with_entropy else None
            return logp, ent
        target = mb["loss_mask"].to(self.device).bool()
        target[:, 0] = False  # the first token has no prediction
        if not target.any():  # a dummy (all-masked) micro-batch: one position, so the head stays in the graph
            target[0, 1] = True
        logits = self._target_logits(module, ids, target, mb["seq_lens"])
        labels = ids[target]
        if with_entropy and entropy_grad:  # the entropy bonus is in the loss: both differentiable
            logp_n, ent_n = logprobs_from_logits(logits, labels, temperature), entropy_from_logits(logits, temperature)
        else:  # one softmax pass; the entropy (if asked) is a statistic
            logp_n, ent_n = logprobs_and_entropy_from_logits(logits, labels, temperature, with_entropy=with_entropy)
        where = target.nonzero(as_tuple=True)  # row-major, the order of logits[keep]
        logp = torch.zeros(ids.shape, dtype=logp_n.dtype, device=self.device).index_put(where, logp_n)
        ent = None if ent_n is None else torch.zeros(ids.shape, dtype=ent_n.dtype, device=self.device).index_put(
            where, ent_n)
        return logp, ent

    def _target_logits(self, module, ids: torch.Tensor, target: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] predicting each target token, in the row-major order of `target.nonzero()`.

        With `actor.share_prompt_prefix`, rows whose tokens before their first target are identical (the episodes
        of one GRPO group) run those tokens through the layers once: the distinct prefixes go first (use_cache),
        each row's remainder then attends to its prefix's K/V (gathered per row, so the gradient of every row
        flows back into the one prefix forward) at positions that continue the prefix. The same function of the
        weights as one forward over the whole rows, to float rounding (tests/unit/trainer/test_step_speedups.py)."""
        split = split_shared_prefixes(ids.cpu(), target.cpu(), seq_lens) if self._shares_prefixes() else None
        if split is None:
            keep = F.pad(target[:, 1:], (0, 1), value=False)  # the position before each target predicts it
            logits = module(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
            return logits[keep] if logits.dim() == 3 else logits  # a model may ignore a boolean logits_to_keep
        from transformers import DynamicCache

        from agentrl.inference.kv_batch import check_full_attention

        dev = self.device
        group, starts = split.group_B.to(dev), split.starts_B.to(dev)
        num_prefixes, width = split.prefix_ids_U_P.shape
        last = torch.zeros(num_prefixes, width, dtype=torch.bool, device=dev)
        last[torch.arange(num_prefixes, device=dev), split.prefix_lens_U.to(dev) - 1] = True
        cache = DynamicCache(config=module.config)
        out = module(input_ids=split.prefix_ids_U_P.to(dev), use_cache=True, logits_to_keep=last,
                     **{self._cache_kw: cache})
        prefix_logits = out.logits[last] if out.logits.dim() == 3 else out.logits  # [prefixes, vocab]
        check_full_attention(cache)
        rows_cache = DynamicCache(config=module.config)
        for layer_index, layer in enumerate(cache.layers):
            rows_cache.update(layer.keys[group], layer.values[group], layer_index)

        rows, suffix_width = split.suffix_ids_B_S.shape
        columns = torch.arange(suffix_width, device=dev)
        # a suffix token sees its own prefix (not the padding of longer ones) and the suffix causally
        own_prefix = torch.arange(width, device=dev) < starts[:, None]
        causal = torch.ones(suffix_width, suffix_width, dtype=torch.bool, device=dev).tril()
        visible = torch.cat([own_prefix[:, None, :].expand(-1, suffix_width, -1), causal.expand(rows, -1, -1)],
                            dim=-1)[:, None]
        if self.model_cfg.attn_implementation != "sdpa":  # eager adds the mask to the scores
            visible = torch.zeros(visible.shape, device=dev).masked_fill(~visible, torch.finfo(torch.float32).min)
        # suffix position s predicts the token at starts + s + 1
        after = starts[:, None] + columns + 1
        keep = target.gather(1, after.clamp(max=target.shape[1] - 1)) & (after < target.shape[1])
        out = module(input_ids=split.suffix_ids_B_S.to(dev), position_ids=starts[:, None] + columns,
                     attention_mask=visible, use_cache=False, logits_to_keep=keep, **{self._cache_kw: rows_cache})
        suffix_logits = out.logits[keep] if out.logits.dim() == 3 else out.logits

        # each row's first target is predicted by its prefix's last position; interleave in row-major order
        counts = target.sum(dim=1)
        has_target = counts > 0
        first_index = (counts.cumsum(0) - counts)[has_target]
        is_first = torch.zeros(int(counts.sum()), dtype=torch.bool, device=dev)
        is_first[first_index] = True
        source = torch.empty(is_first.shape[0], dtype=torch.long, device=dev)
        num_first = int(has_target.sum())
        source[is_first] = torch.arange(num_first, device=dev)
        source[~is_first] = num_first + torch.arange(is_first.shape[0] - num_first, device=dev)
        return torch.cat([prefix_logits[group[has_target]], suffix_logits])[source]

    def _shares_prefixes(self) -> bool:
        """Prefix sharing needs a 4D attention mask (sdpa, eager: not flash-attention), the LM head at chosen
        positions (fast_logprobs), a KV cache in training (which gradient checkpointing turns off) and full
        attention in every layer (a sliding window's cache keeps only the window)."""
        config = self.model.config
        full_attention = (not getattr(config, "use_sliding_window", False)
                          and all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or []))
        return (self.actor.share_prompt_prefix and self.actor.fast_logprobs and full_attention
                and self.model_cfg.attn_implementation in ("sdpa", "eager")
                and not self.model_cfg.gradient_checkpointing)

    @functools.cached_property
    def _cache_kw(self) -> str:
        return cache_kwarg(hf_model(self.model))

    @staticmethod
    def _entropy(logits: torch.Tensor, temperature: float, grad: bool) -> torch.Tensor:
        if grad:
            return entropy_from_logits(logits, temperature)
        with torch.no_grad():
            return entropy_from_logits(logits.detach(), temperature)

    def _reuse_is_exact(self) -> bool:
        """The update's first forward equals a separate no-grad forward only when train mode changes nothing:
        no dropout anywhere (train() vs eval())."""
        config = self.model.config
        if any(float(getattr(config, name, 0.0) or 0.0) > 0 for name in
               ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")):
            return False
        return not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())

    @torch.no_grad()
    def compute_logprobs(self, micro_batches: list[TensorDict], temperature: float, ref: bool = False,
                         with_entropy: bool = False) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per micro-batch (logprobs [b, w], entropy [b, w] or None) on CPU, under the policy or the reference
        (under LoRA: the policy with its adapters off, i.e. the base model)."""
        lora_ref = ref and self.lora is not None
        module = self.ref if ref and not lora_ref else self.model
        if module is None:
            raise RuntimeError("compute_logprobs(ref=True) but the worker has no reference model "
                               "(it is only built when actor.use_kl_loss is true)")
        module.eval()
        out = []
        with adapters_off(module) if lora_ref else contextlib.nullcontext():
            for mb in micro_batches:
                logp, ent = self._forward(module, mb, temperature, with_entropy, entropy_grad=False)
                real = (torch.arange(logp.shape[1]) < mb["seq_lens"][:, None]).float()  # padding reads as 0
                out.append((logp.float().cpu() * real, None if ent is None else ent.float().cpu() * real))
        return out

    # ----------------------------------------------------------------------------------------------- losses

    def _ppo_loss(self, mb: TensorDict, num_tokens: int, num_seqs: int, temperature: float):
        a = self.actor
        need_entropy = a.entropy_coeff != 0 or a.calculate_entropy
        logp, ent = self._forward(self.model, mb, temperature, need_entropy, entropy_grad=a.entropy_coeff != 0)
        if "old_logprobs" in mb.keys():
            old = mb["old_logprobs"].to(self.device)
        else:  # reused: this forward is the first under the pre-update weights, so it is pi_old (update_policy)
            old = logp.detach() * mb["loss_mask"].to(self.device)
            self._reused_old.append(old.cpu())
        optional = {name: mb[name].to(self.device) if name in mb.keys() else None
                    for name in ("rollout_logprobs", "rollout_is_weights", "ref_logprobs")}
        mask = mb["loss_mask"].to(self.device)
        is_weights = optional["rollout_is_weights"]
        if is_weights is None and self._in_loss_correction is not None:  # from this update's own pi_old
            level, threshold, mode = self._in_loss_correction
            is_weights, _ = rollout_is_weights(old - optional["rollout_logprobs"], mask, level, threshold, mode=mode)
        inputs = PolicyLossInputs(
            logprobs_B_T=logp, old_logprobs_B_T=old, advantages_B_T=mb["advantages"].to(self.device),
            mask_B_T=mask, rollout_logprobs_B_T=optional["rollout_logprobs"],
            is_weights_B_T=is_weights, agg_mode=a.loss_agg_mode, num_tokens=num_tokens,
            num_seqs=num_seqs, scale_factor=a.loss_scale_factor)
        return ppo_objective(
            inputs, a.policy_loss.loss_mode, a.policy_loss_knobs(),
            ref_logprobs_B_T=optional["ref_logprobs"] if a.use_kl_loss else None, kl_loss_coef=a.kl_loss_coef,
            kl_loss_type=a.kl_loss_type, entropy_B_T=ent, entropy_coeff=a.entropy_coeff)

    def _sft_loss(self, mb: TensorDict, num_tokens: int, num_seqs: int, temperature: float):
        logp, _ = self._forward(self.model, mb, 1.0, False)
        mask = mb["loss_mask"].to(self.device)
        loss = agg_loss(-logp, mask, "token-mean", num_tokens=num_tokens, num_seqs=num_seqs)
        return loss, {"sft_loss": loss.detach()}

    def update_policy(self, mini_batches: list[list[TensorDict]], counts: list[tuple[int, int]],
                      temperature: float, reuse_old: bool = False, is_correction: tuple | None = None):
        """One optimizer step per mini-batch (its micro-batches accumulate); the LR schedule advances once.

        counts[k] = (loss tokens, trajectories) of mini-batch k over ALL ranks. Returns mini-batch averages of
        pg_loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl, kl_loss, kl, entropy, grad_norm, plus lr,
        optimizer_steps and skipped_steps (non-finite grad norm).

        reuse_old: the micro-batches carry no old_logprobs and every row is in exactly one mini-batch (one epoch).
        pi_old is then this call's own: mini-batches after the first get a no-grad forward before the first
        optimizer step, and the first mini-batch takes its logprobs from its training forward (the same weights,
        no dropout: exactly pi_old, so the ratio is exactly 1 there). Returns (metrics, old logprobs [b, w] per
        micro-batch per mini-batch) so the driver has pi_old for its metrics and records.

        is_correction (with reuse_old): (level "token", threshold, mode) of `algorithm.rollout_correction`; the
        loss weights each token by `rollout_is_weights(pi_old - pi_rollout)` from this pi_old, the weights the
        driver would compute from a separate pi_old pass.
        """
        if not reuse_old:
            return self._train(self._ppo_loss, mini_batches, counts, temperature)
        if is_correction is not None and is_correction[0] != "token":
            raise ValueError(f"rollout correction inside the update is per token; level {is_correction[0]!r} needs "
                             "whole trajectories and a separate pi_old pass")
        exact = self._reuse_is_exact()
        old: list[list[torch.Tensor]] = []
        for k, micro_batches in enumerate(mini_batches):
            if k > 0 or not exact:
                logps = [logp for logp, _ in self.compute_logprobs(micro_batches, temperature)]
                for mb, logp in zip(micro_batches, logps):
                    mb["old_logprobs"] = logp
                old.append(logps)
            else:
                old.append([])
        self._reused_old, self._in_loss_correction = [], is_correction
        try:
            metrics = self._train(self._ppo_loss, mini_batches, counts, temperature)
        finally:
            self._in_loss_correction = None
        if exact:
            old[0] = self._reused_old
        self._reused_old = []
        return metrics, old

    def update_sft(self, mini_batches: list[list[TensorDict]], counts: list[tuple[int, int]]) -> dict[str, float]:
        """Supervised step(s): token-mean NLL over loss-mask tokens, same micro-batching and schedule."""
        return self._train(self._sft_loss, mini_batches, counts, 1.0)

    def gradients(self, micro_batches: list[TensorDict], num_tokens: int, num_seqs: int,
                  temperature: float) -> dict[str, torch.Tensor] | None:
        """The full (unsharded) PPO gradient of one mini-batch without stepping; rank 0 returns it (debugging
        and tests: 1 vs 2 ranks, 1 vs 4 micro-batches, masked tokens)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        self._accumulate(self._ppo_loss, micro_batches, num_tokens, num_seqs, temperature, defaultdict(float))
        grads = {}
        for name, p in self.model.named_parameters():
            if not p.requires_grad:  # LoRA: the frozen weights
                continue
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads[name] = unsharded(g)
        self.optimizer.zero_grad(set_to_none=True)
        return grads if self.rank == 0 else None

class WorkerGroup(FSDPGroup):
    """The policy's ranks (`PolicyWorker`): log-probabilities, PPO and SFT updates, weights for the engines."""

    worker_cls = PolicyWorker

    def __init__(self, model: ModelConfig, actor: ActorConfig, *, with_ref: bool = False, total_steps: int = 1,
                 seed: int = 0, deterministic: bool = False, use_ray: bool = True):
        super().__init__(model, actor, total_steps=total_steps, seed=seed, deterministic=deterministic,
                         use_ray=use_ray, with_ref=with_ref)

    @property
    def actor(self) -> ActorConfig:
        return self.cfg

    # ------------------------------------------------------------------------------------------- public API

    def compute_logprobs(self, batch: TensorDict, *, temperature: float, ref: bool = False,
                         with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token logprobs [B, L] aligned with batch["input_ids"] (and entropies when asked)."""
        plan = self._plan(batch, None)
        parts = self._call("compute_logprobs", [(mbs, temperature, ref, with_entropy)
                                                for mbs in materialize(batch, plan)])
        size, width = batch["input_ids"].shape
        logp = scatter_rows([[p[0] for p in rank] for rank in parts], plan, size, width)
        ent = scatter_rows([[p[1] for p in rank] for rank in parts], plan, size, width) if with_entropy else None
        return logp, ent

    def update_policy(self, batch: TensorDict, *, temperature: float, mini_batch_size: int, epochs: int = 1,
                      shuffle: bool = True, seed: int = 0, strategy: str = "bucket",
                      reuse_old_logprobs: bool = False, is_correction: tuple | None = None) -> dict[str, float]:
        """PPO epochs x mini-batches of `mini_batch_size` trajectories; needs old_logprobs (and ref_logprobs
        when the KL loss is on) in `batch`. Returns the worker metrics of `PolicyWorker.update_policy`.

        reuse_old_logprobs (one epoch only): `batch` has no old_logprobs yet; the ranks take pi_old from the
        update itself (`PolicyWorker.update_policy`, reuse_old) and this call writes it to batch["old_logprobs"]
        — the same values a separate `compute_logprobs` pass gives, without the first mini-batch's extra forward.
        is_correction: token-level rollout-correction weights computed in the loss from that pi_old
        (`PolicyWorker.update_policy`)."""
        steps = mini_batches(batch.batch_size[0], mini_batch_size, epochs=epochs, shuffle=shuffle, seed=seed)
        if not reuse_old_logprobs:
            return self._dispatch_train("update_policy", batch, steps, strategy, temperature)
        if epochs != 1:
            raise ValueError("reuse_old_logprobs needs epochs == 1: a later epoch's forward is no longer pi_old")
        per_rank, counts, plans = self._plan_train(batch, steps, strategy)
        results = self._call("update_policy", [(per_rank[r], counts, temperature, True, is_correction)
                                               for r in range(self.world_size)])
        size, width = batch["input_ids"].shape
        old = torch.zeros(size, width)
        for k, plan in enumerate(plans):
            old += scatter_rows([rank_old[k] for _, rank_old in results], plan, size, width)  # disjoint rows
        batch["old_logprobs"] = old
        return results[0][0]

    def update_sft(self, batch: TensorDict, *, mini_batch_size: int | None = None, shuffle: bool = False,
                   seed: int = 0) -> dict[str, float]:
        """Masked-NLL step(s) on a batch from `batch.sft_batch` (one optimizer step per mini-batch)."""
        size = batch.batch_size[0]
        steps = mini_batches(size, mini_batch_size or size, shuffle=shuffle, seed=seed)
        return self._dispatch_train("update_sft", batch, steps, "bucket")

    def broadcast_weights(self, target: dict) -> dict[str, float]:
        """`PolicyWorker.broadcast_weights` on every rank; rank 0's metrics (a `BroadcastError` naming the server
        that failed, with rank 0's message rather than Ray's traceback)."""
        from agentrl.inference.weight_broadcast import BroadcastError

        try:
            return self._call("broadcast_weights", [(target,)] * self.world_size)[0]
        except BroadcastError as e:
            raise BroadcastError(str(getattr(e, "cause", None) or e)) from None

    def gradients(self, batch: TensorDict, *, temperature: float, strategy: str = "bucket") -> dict[str, torch.Tensor]:
        """Full gradient of the PPO objective over the whole batch as one mini-batch (no optimizer step)."""
        plan = self._plan(batch, None, strategy)
        counts = (int(batch["loss_mask"].sum()), batch.batch_size[0])
        results = self._call("gradients", [(mbs, *counts, temperature) for mbs in materialize(batch, plan)])
        return results[0]


# FSDPGroup, FSDPWorker, lr_factor, rank_threads and start_ray are re-exported: they lived here before fsdp.py
__all__ = ["FSDPGroup", "FSDPWorker", "PolicyWorker", "WorkerGroup", "lr_factor", "rank_threads", "start_ray"]
