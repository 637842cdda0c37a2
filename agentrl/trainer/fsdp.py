"""FSDP2 plumbing every trained model shares: `FSDPWorker` (one rank, one Ray actor) and `FSDPGroup` (the
driver's handle on the ranks). The policy is `agentrl.trainer.worker`, the critic `agentrl.trainer.critic`.

`FSDPWorker`: process group and device mesh, a model sharded per decoder layer, AdamW with the LR schedule,
gradient accumulation over micro-batches with the mini-batch's global counts, clip-and-step, sharded
checkpoints, the unsharded state dict (in memory or through shared memory for an engine on the same host).
A worker is deliberately dumb: the driver (`FSDPGroup`) decides which rows go to which rank and micro-batch
(`agentrl.trainer.batch.plan_micro_batches`) and passes the global token and sequence counts of every
mini-batch, so every rank runs the same number of forwards (FSDP collectives match) and the objective does not
depend on how a mini-batch is cut. FSDP averages gradients over ranks; the global counts already normalise the
loss, so each rank's loss is multiplied by the world size before backward.
"""

from __future__ import annotations

import math
import os
import random
from collections import defaultdict
from pathlib import Path

import torch
from tensordict import TensorDict

from agentrl.errors import RankDiedError, UserError
from agentrl.numerics import usable_cores
from agentrl.services import free_port, start_ray
from agentrl.trainer.batch import MicroBatchPlan, materialize, plan_micro_batches
from agentrl.trainer.checkpoint import SHARDS_DIR, CheckpointError
from agentrl.trainer.config import LoraConfig, ModelConfig
from agentrl.trainer.lora import hf_model, merged_state_dict, trainable_names, write_adapter
from agentrl.trainer.lora import wrap as lora_wrap

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """LR multiplier after `step` scheduler steps: linear warmup, then constant or cosine down to min_lr_ratio.

    A function of the step and the planned total only, so a resumed run whose total changed continues on the
    schedule of the new total (`FSDPWorker.load_checkpoint`)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def rank_threads(world_size: int) -> int:
    """Default torch threads of a training rank: the cores this process may run on, split over the ranks.

    Not Ray's OMP_NUM_THREADS (1 for a 1-CPU actor): the RL loop alternates rollout and training, so the ranks
    and an in-process engine never compute at the same time, and a rank left at one thread idles the other
    cores through every update. On this 2-core machine, 1 -> 2 threads made the update 1.6x faster with
    bit-identical results (`agentrl bench step`; docs/benchmarks.md)."""
    return max(1, usable_cores() // max(1, world_size))


def unsharded(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2-sharded parameter or gradient, detached, on CPU (collective for a DTensor: every
    rank must call, in the same order); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()


class FSDPWorker:
    """One FSDP2 rank of a trained model; subclasses build their modules in `_build_models` and add the loss.

    `cfg` is the component's training config (`ActorConfig`, `CriticConfig`): the optimizer (lr, betas,
    weight_decay, grad_clip), the schedule (warmup_steps, lr_schedule, min_lr_ratio) and the rank's resources
    (num_gpus_per_worker, num_threads_per_worker). Checkpoints go to `<checkpoint>/<SHARDS_DIR>/` (model and
    optimizer) and `<checkpoint>/<RANK_FILE>` (scheduler, RNG states, step counters).
    """

    SHARDS_DIR = SHARDS_DIR
    RANK_FILE = "worker_rank{rank}.pt"
    # Statistics averaged over loss tokens (weighted by each micro-batch's token count); others are summed terms.
    TOKEN_WEIGHTED: tuple[str, ...] = ()

    def __init__(self, model: ModelConfig, cfg, *, rank: int = 0, world_size: int = 1, total_steps: int = 1,
                 seed: int = 0, deterministic: bool = False):
        self.model_cfg, self.cfg = model, cfg
        self.rank, self.world_size = rank, world_size
        self.total_steps, self.seed = total_steps, seed
        self.deterministic = deterministic
        self.skipped_steps = 0
        self.optimizer_steps = 0
        self.lora = None  # the LoraConfig when `_load` put peft adapters on the trained model
        self.grad_bytes = 0  # bytes of the .grad tensors at the last optimizer step (`memory_bytes`)
        self._owns_group = False  # True when setup() created the torch.distributed group (and must destroy it)

    # ------------------------------------------------------------------------------------------------ setup

    def node_address(self) -> tuple[str, int]:
        """(address, free port) for the process-group rendezvous, asked of rank 0."""
        if self.world_size == 1:
            return "127.0.0.1", free_port()
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def host_address(self) -> str:
        """This rank's node address (the driver compares it with its own before sharing memory)."""
        import ray

        return ray.util.get_node_ip_address()

    def node(self) -> tuple[str, str]:
        """(address, Ray node id) of this rank's node, recorded by the driver to name a rank that dies."""
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def setup(self, master_addr: str, master_port: int) -> None:
        import torch.distributed as dist

        from agentrl.console import quiet_third_party

        quiet_third_party()  # a Ray worker is its own process: no weight-loading bars here either
        torch.set_num_threads(self._threads_per_rank() or rank_threads(self.world_size))
        if self.deterministic:
            torch.use_deterministic_algorithms(True)
        use_cuda = self.cfg.num_gpus_per_worker > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
            if self.deterministic:  # cuBLAS needs a fixed workspace for deterministic matmuls
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            dist.init_process_group("nccl" if use_cuda else "gloo", init_method=f"tcp://{master_addr}:{master_port}",
                                    rank=self.rank, world_size=self.world_size)
        elif dist.get_world_size() != self.world_size:
            raise RuntimeError(f"a torch.distributed group of size {dist.get_world_size()} already exists in this "
                               f"process; actor.world_size is {self.world_size}")
        from torch.distributed.device_mesh import init_device_mesh

        # An explicit mesh: the parameters' device follows num_gpus_per_worker, not whatever is visible.
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        torch.manual_seed(self.seed)
        random.seed(self.seed)
        self.model = self._build_models()
        betas = (self.cfg.betas[0], self.cfg.betas[1])
        trained = [p for p in self.model.parameters() if p.requires_grad]  # under LoRA: the adapters only
        self.optimizer = torch.optim.AdamW(trained, lr=self.cfg.lr, betas=betas, weight_decay=self.cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: self._lr_factor(s))

    def _build_models(self):
        """Load and shard this rank's modules; returns the trained one (its parameters get the optimizer)."""
        raise NotImplementedError

    def _threads_per_rank(self) -> int | None:
        """torch intra-op threads of this rank; None: `rank_threads(world_size)`."""
        return None

    def _lr_factor(self, step: int) -> float:
        return lr_factor(step, warmup_steps=self.cfg.warmup_steps, total_steps=self.total_steps,
                         schedule=self.cfg.lr_schedule, min_lr_ratio=self.cfg.min_lr_ratio)

    def _load(self, trainable: bool, auto_class=None, lora: LoraConfig | None = None, **config_changes):
        """`auto_class.from_pretrained(model.path)` (default AutoModelForCausalLM), sharded over the mesh;
        `config_changes` override keys of the model's config.json (e.g. num_labels). `lora`: peft adapters are put
        on the loaded model before it is sharded, and only they train (`agentrl.trainer.lora`)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoConfig, AutoModelForCausalLM

        path = self.model_cfg.path
        if not Path(path).is_dir():
            raise FileNotFoundError(f"model path {path!r} is not a directory; point it at an HF model dir "
                                    "(e.g. one written by `agentrl init-model`)")
        extra = {"config": AutoConfig.from_pretrained(path, **config_changes)} if config_changes else {}
        model = (auto_class or AutoModelForCausalLM).from_pretrained(
            path, dtype=_DTYPES[self.model_cfg.dtype], attn_implementation=self.model_cfg.attn_implementation,
            **extra)
        if trainable and self.model_cfg.gradient_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if not trainable:
            model.requires_grad_(False)
            model.eval()
        if trainable and lora is not None:
            model = lora_wrap(model, lora, path)
            self.lora = lora
        # Left on CPU: fully_shard moves each layer to the mesh's device as it shards it, so a GPU never holds
        # more than one unsharded layer at load time.
        kwargs = {"mesh": self.mesh}
        if self.device.type == "cuda" and self.model_cfg.mixed_precision != "none":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=_DTYPES[self.model_cfg.mixed_precision],
                                                       reduce_dtype=torch.float32)
        layers = getattr(getattr(hf_model(model), "model", None), "layers", None)
        if layers is None:
            raise ValueError(f"{path}: expected a decoder with model.layers (Qwen2/Llama-style); got "
                             f"{type(model).__name__}")
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model

    # ----------------------------------------------------------------------------------------------- training

    def _accumulate(self, loss_fn, micro_batches: list[TensorDict], num_tokens: int, num_seqs: int,
                    temperature: float, sums: dict[str, float]) -> None:
        """Forward/backward every micro-batch (gradients accumulate) and add its statistics into `sums`."""
        for mb in micro_batches:
            loss, stats = loss_fn(mb, num_tokens, num_seqs, temperature)
            (loss * self.world_size).backward()
            tokens = float(mb["loss_mask"].sum())
            for name, value in stats.items():
                sums[name] += float(value) * (tokens if name in self.TOKEN_WEIGHTED else 1.0)

    def _global_grad_norm(self) -> float:
        """L2 norm of the full gradient: squares of every local shard summed over ranks. (torch's
        clip_grad_norm_ over FSDP2 DTensors was measured 5e-5 off the true norm with 2 ranks here.)"""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        total = torch.zeros((), dtype=torch.float64, device=self.device)
        self.grad_bytes = 0
        for p in self.model.parameters():
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                total += g.detach().double().square().sum()
                self.grad_bytes += g.nbytes
        if self.world_size > 1:
            dist.all_reduce(total)
        return float(total.sqrt())

    def _clip_and_step(self) -> float:
        grad_norm = self._global_grad_norm()
        if math.isfinite(grad_norm) and grad_norm > self.cfg.grad_clip:
            scale = self.cfg.grad_clip / (grad_norm + 1e-6)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.optimizer_steps += 1
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def memory_bytes(self) -> dict[str, int]:
        """This rank's bytes of parameters (its shards), of the trained ones, of the .grad tensors of the last
        optimizer step and of the optimizer state (AdamW's moments and step counters), as allocated."""
        from torch.distributed.tensor import DTensor

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if isinstance(t, DTensor) else t

        params = [local(p) for p in self.model.parameters()]
        trained = [local(p) for p in self.model.parameters() if p.requires_grad]
        state = [local(t) for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        return {"parameters": sum(t.nbytes for t in params), "trained_parameters": sum(t.nbytes for t in trained),
                "grads": self.grad_bytes, "optimizer": sum(t.nbytes for t in state)}

    def _reduce(self, sums: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        names = sorted(sums)
        if self.world_size > 1 and names:
            t = torch.tensor([sums[n] for n in names], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            return dict(zip(names, t.tolist()))
        return dict(sums)

    def _train(self, loss_fn, mini_batches: list[list[TensorDict]], counts: list[tuple[int, int]],
               temperature: float) -> dict[str, float]:
        self.model.train()
        per_step: dict[str, list[float]] = defaultdict(list)
        skipped_before = self.skipped_steps
        for micro_batches, (num_tokens, num_seqs) in zip(mini_batches, counts, strict=True):
            sums: dict[str, float] = defaultdict(float)
            self.optimizer.zero_grad(set_to_none=True)
            self._accumulate(loss_fn, micro_batches, num_tokens, num_seqs, temperature, sums)
            grad_norm = self._clip_and_step()
            for name, value in self._reduce(sums).items():
                per_step[name].append(value / max(num_tokens, 1) if name in self.TOKEN_WEIGHTED else value)
            if math.isfinite(grad_norm):
                per_step["grad_norm"].append(grad_norm)
        metrics = {name: sum(v) / len(v) for name, v in per_step.items() if v}
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        metrics["optimizer_steps"] = float(len(mini_batches))
        metrics["skipped_steps"] = float(self.skipped_steps - skipped_before)
        return metrics

    # ------------------------------------------------------------------------------------ state in and out

    def _gather_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded CPU state dict (collective: every rank must call); on CPU its tensors may alias the live
        parameters."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _engine_weights(self) -> dict[str, torch.Tensor] | None:
        """The unsharded CPU weights under the HF model's names (collective); under LoRA the adapters merged into
        their layers (fresh tensors: the training weights are not touched). Rank 0 returns them, others None."""
        sd = self._gather_state_dict()
        if self.rank != 0 or self.lora is None:
            return sd if self.rank == 0 else None
        return merged_state_dict(sd, self.lora)

    def save_adapter(self, path: str) -> None:
        """Write the LoRA adapter in peft's on-disk format to `path` (collective; rank 0 writes):
        adapter_config.json and adapter_model.safetensors, as `PeftModel.save_pretrained` writes them."""
        if self.lora is None:
            raise ValueError("save_adapter: this model trains no LoRA adapters (actor.lora is null)")
        # only the adapters are gathered: the frozen weights stay in their shards
        adapters = {name: unsharded(p) for name, p in self.model.named_parameters() if p.requires_grad}
        if self.rank == 0:
            write_adapter(adapters, self.lora, self.model_cfg.path, path)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Unsharded CPU state dict under the HF model's names, LoRA adapters merged (collective: every rank must
        call); rank 0 returns it, others None."""
        sd = self._engine_weights()
        if self.rank != 0:
            return None
        if self.device.type == "cpu":  # on CPU the gathered tensors may alias the live parameters: snapshot them
            sd = {name: tensor.clone() for name, tensor in sd.items()}
        return sd

    def stage_full_state_dict(self) -> tuple[str, list[tuple], int] | None:
        """`full_state_dict` written into this rank's shared-memory file (`SharedStateDict`, created on the first
        call); rank 0 returns its handle (path, layout, size), others None. Collective, like full_state_dict.
        Rank 0 returns None too when /dev/shm has no room for the weights (the caller then gathers them the
        ordinary way)."""
        from agentrl.trainer.weight_sync import SharedStateDict

        sd = self._engine_weights()
        if self.rank != 0:
            return None
        shared = getattr(self, "_shared_weights", None)
        if shared is None or not shared.matches(sd):
            if shared is not None:
                shared.close()
                self._shared_weights = None
            if not SharedStateDict.fits(SharedStateDict.layout_size(sd)):
                return None
            shared = self._shared_weights = SharedStateDict.create(sd)
        shared.write(sd)
        return shared.handle()

    def save_checkpoint(self, path: str) -> None:
        """Sharded model + optimizer (torch.distributed.checkpoint) and this rank's scheduler and RNG states."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._checkpoint_state(), checkpoint_id=str(Path(path) / self.SHARDS_DIR))
        extra = {"scheduler": self.scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
                 "python_rng": random.getstate(), "skipped_steps": self.skipped_steps,
                 "optimizer_steps": self.optimizer_steps}
        if torch.cuda.is_available() and self.device.type == "cuda":
            extra["cuda_rng"] = torch.cuda.get_rng_state()
        torch.save(extra, Path(path) / self.RANK_FILE.format(rank=self.rank))

    def load_checkpoint(self, path: str) -> None:
        """Weights, optimizer moments, RNG states and the scheduler position from `path`. The optimizer's
        hyperparameters and the LR schedule come from this worker's config: the LR of the next step is
        `lr * lr_factor(steps taken, total_steps of this run)`, so changing `trainer.total_steps` or the lr on
        resume takes effect from the next step."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        extra_path = Path(path) / self.RANK_FILE.format(rank=self.rank)
        if not (Path(path) / self.SHARDS_DIR).is_dir():
            raise FileNotFoundError(f"{path} has no {self.SHARDS_DIR}/: the checkpoint was written without this "
                                    "model (e.g. by a run without a critic)")
        if not extra_path.is_file():
            raise FileNotFoundError(f"{extra_path} is missing: the checkpoint was written with a different "
                                    f"world_size (this run has {self.world_size})")
        self._check_checkpoint_kind(Path(path) / self.SHARDS_DIR)
        state = self._checkpoint_state()
        dcp.load(state, checkpoint_id=str(Path(path) / self.SHARDS_DIR))
        # under LoRA the frozen weights are not in the checkpoint: they stay as model.path gave them
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=self.lora is None))
        extra = torch.load(extra_path, weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        self._apply_optimizer_config()
        torch.set_rng_state(extra["torch_rng"])
        random.setstate(extra["python_rng"])
        if "cuda_rng" in extra and self.device.type == "cuda":
            torch.cuda.set_rng_state(extra["cuda_rng"])
        self.skipped_steps, self.optimizer_steps = extra["skipped_steps"], extra["optimizer_steps"]

    def _checkpoint_state(self) -> dict:
        """{"model", "optim"}: the sharded state dicts a checkpoint holds; under LoRA the adapters only (the frozen
        weights are model.path's) and their optimizer state."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if self.lora is not None:
            trained = trainable_names(self.model)
            model_sd = {name: tensor for name, tensor in model_sd.items() if name in trained}
        return {"model": model_sd, "optim": optim_sd}

    def _check_checkpoint_kind(self, shards: Path) -> None:
        """A full-model checkpoint loaded under LoRA, or an adapter checkpoint without it: one clear error."""
        import torch.distributed.checkpoint as dcp

        names = dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
        has_adapters = any(".lora_A." in name for name in names)
        if has_adapters != (self.lora is not None):
            held, wanted = ("LoRA adapters", "the full model") if has_adapters else ("a full model", "LoRA adapters")
            raise CheckpointError(f"{shards.parent} holds {held}, but this run trains {wanted} (actor.lora is "
                             f"{'null' if self.lora is None else 'set'}): set actor.lora as the checkpoint's run had "
                             "it, or start over")

    def _apply_optimizer_config(self) -> None:
        """Hyperparameters from the config (a checkpoint's param groups carry the values it was saved with)."""
        self.scheduler.base_lrs = [self.cfg.lr for _ in self.optimizer.param_groups]
        lr = self.cfg.lr * self._lr_factor(self.scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group.update(lr=lr, initial_lr=self.cfg.lr, betas=tuple(self.cfg.betas),
                         weight_decay=self.cfg.weight_decay)

    def shutdown(self) -> None:
        import torch.distributed as dist

        shared = getattr(self, "_shared_weights", None)
        if shared is not None:
            shared.close()
            self._shared_weights = None
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()


class FSDPGroup:
    """The driver's handle on the ranks of one trained model: plans micro-batches, dispatches, gathers.

    use_ray=True: one Ray actor per rank (`cfg.world_size` of them). use_ray=False: a single in-process rank
    (world_size must be 1), handy for benchmarks and SFT on one machine. Subclasses name their `worker_cls`.
    """

    worker_cls: type[FSDPWorker] = FSDPWorker

    def __init__(self, model: ModelConfig, cfg, *, total_steps: int = 1, seed: int = 0, deterministic: bool = False,
                 use_ray: bool = True, **worker_kwargs):
        # Ray workers may not share the driver's working directory: hand them absolute paths.
        model = model.model_copy(update={"path": str(Path(model.path).resolve())})
        self.model_cfg, self.cfg, self.use_ray = model, cfg, use_ray
        self.world_size = cfg.world_size
        kwargs = {"world_size": self.world_size, "total_steps": total_steps, "seed": seed,
                  "deterministic": deterministic, **worker_kwargs}
        if use_ray:
            import ray

            if not ray.is_initialized():
                raise RuntimeError(f"{type(self).__name__}(use_ray=True) needs ray.init() first")
            remote = ray.remote(self.worker_cls)
            self._placement = place_ranks(cfg) if cfg.nnodes > 1 else None
            self.workers = [remote.options(num_cpus=cfg.num_cpus_per_worker, num_gpus=cfg.num_gpus_per_worker,
                                           **self._rank_options(r)).remote(model, cfg, rank=r, **kwargs)
                            for r in range(self.world_size)]
            self.rank_nodes = self._call("node")  # (address, node id) per rank, named by RankDiedError
        else:
            if self.world_size != 1:
                raise ValueError(f"{type(self).__name__}(use_ray=False) runs one in-process rank; set world_size "
                                 "to 1 or use Ray")
            self.workers = [self.worker_cls(model, cfg, rank=0, **kwargs)]
        addr, port = self._call_one(0, "node_address")
        self._call("setup", [(addr, port)] * self.world_size)

    # --------------------------------------------------------------------------------------------- dispatch

    def _call(self, method: str, per_rank_args: list[tuple] | None = None, **kwargs) -> list:
        args = per_rank_args or [()] * self.world_size
        if not self.use_ray:
            return [getattr(self.workers[0], method)(*args[0], **kwargs)]
        import ray

        if not self.workers:  # a rank died and the group was stopped: nothing may pretend to succeed (a checkpoint)
            raise RuntimeError(f"{type(self).__name__}.{method}: the group's ranks were stopped (shut down, or one "
                               "died)")
        refs = [getattr(w, method).remote(*a, **kwargs) for w, a in zip(self.workers, args)]
        pending = list(refs)
        while pending:  # one at a time: a dead rank is seen at once, not after the others (maybe never) return
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                rank = refs.index(ready[0])
                self._kill_ranks()  # the others may wait in a collective for the dead rank forever
                raise rank_died(type(self).__name__, rank, self.world_size, self._node_of(rank), method,
                                e) from None
        return ray.get(refs)

    def _rank_options(self, rank: int) -> dict:
        """Ray options of rank `rank`'s actor beyond CPUs and GPUs: custom resources, its placement-group bundle."""
        options = {"resources": dict(self.cfg.resources_per_worker)} if self.cfg.resources_per_worker else {}
        if self._placement is None:
            return options
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {**options, "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=self._placement, placement_group_bundle_index=rank)}

    def _node_of(self, rank: int) -> str:
        nodes = getattr(self, "rank_nodes", None)
        return f"{nodes[rank][0]} (id {nodes[rank][1][:12]})" if nodes else "unknown (it died while starting)"

    def _kill_ranks(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if getattr(self, "_placement", None) is not None:
            ray.util.remove_placement_group(self._placement)
            self._placement = None

    def _call_one(self, rank: int, method: str, *args):
        if not self.use_ray:
            return getattr(self.workers[rank], method)(*args)
        import ray

        return ray.get(getattr(self.workers[rank], method).remote(*args))

    def _plan(self, batch: TensorDict, rows: list[int] | None, strategy: str = "bucket") -> MicroBatchPlan:
        return plan_micro_batches(batch["seq_lens"].tolist(), rows, world_size=self.world_size,
                                  max_tokens=self.cfg.max_tokens_per_micro_batch,
                                  max_rows=self.cfg.ppo_micro_batch_size, strategy=strategy)

    def _plan_train(self, batch: TensorDict, steps: list[list[int]], strategy: str):
        """Micro-batches per rank per optimizer step, each step's global (loss tokens, trajectories), the plans."""
        per_rank: list[list[list[TensorDict]]] = [[] for _ in range(self.world_size)]
        counts, plans = [], []
        for rows in steps:
            plan = self._plan(batch, rows, strategy)
            for r, mbs in enumerate(materialize(batch, plan)):
                per_rank[r].append(mbs)
            counts.append((int(batch["loss_mask"][torch.tensor(rows)].sum()), len(rows)))
            plans.append(plan)
        return per_rank, counts, plans

    def _dispatch_train(self, method: str, batch: TensorDict, steps: list[list[int]], strategy: str,
                        *extra) -> dict[str, float]:
        per_rank, counts, _ = self._plan_train(batch, steps, strategy)
        results = self._call(method, [(per_rank[r], counts, *extra) for r in range(self.world_size)])
        return results[0]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self._call("full_state_dict")[0]

    def memory_bytes(self) -> dict[str, int]:
        """Rank 0's `FSDPWorker.memory_bytes` (parameters, trained parameters, grads, optimizer state)."""
        return self._call("memory_bytes")[0]

    def save_adapter(self, path: str | Path) -> Path:
        """The LoRA adapter in peft's format (adapter_config.json, adapter_model.safetensors) written to `path`;
        the path rank 0 wrote, which must be reachable from the caller (a shared filesystem on a cluster)."""
        self._call("save_adapter", [(str(Path(path).resolve()),)] * self.world_size)
        return Path(path).resolve()

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded weights for an engine in the driver's process, valid until the next call: views into
        rank 0's shared-memory file when rank 0 runs on this host (one copy, nothing pickled), else
        `full_state_dict()`."""
        from agentrl.trainer.weight_sync import SharedStateDict

        if not self.use_ray or not self._rank0_on_this_host():
            return self.full_state_dict()
        handle = self._call("stage_full_state_dict")[0]
        if handle is None:  # no room in /dev/shm: the ordinary gather, from now on
            self._same_host = False
            return self.full_state_dict()
        shared = getattr(self, "_shared_weights", None)
        if shared is None or shared.path != handle[0]:  # first call, or rank 0 laid out a new file
            if shared is not None:
                shared.close()
            shared = self._shared_weights = SharedStateDict.attach(*handle)
        return shared.views()

    def _rank0_on_this_host(self) -> bool:
        from agentrl.trainer.weight_sync import SharedStateDict

        if getattr(self, "_same_host", None) is None:
            import ray

            self._same_host = SharedStateDict.available() and \
                self._call_one(0, "host_address") == ray.util.get_node_ip_address()
        return self._same_host

    def save_checkpoint(self, path: str | Path) -> None:
        self._call("save_checkpoint", [(str(Path(path).resolve()),)] * self.world_size)

    def load_checkpoint(self, path: str | Path) -> None:
        self._call("load_checkpoint", [(str(Path(path).resolve()),)] * self.world_size)

    def shutdown(self) -> None:
        if self.workers:  # empty after a rank died (the others were killed with it)
            self._call("shutdown")
        shared = getattr(self, "_shared_weights", None)
        if shared is not None:
            shared.close()
            self._shared_weights = None
        if self.use_ray:
            self._kill_ranks()
        self.workers = []


class PlacementError(UserError):
    """The cluster cannot hold the ranks' placement group (`place_ranks`)."""


def rank_died(group: str, rank: int, world_size: int, node: str, method: str, cause: BaseException) -> RankDiedError:
    reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return RankDiedError(f"{group} rank {rank} of {world_size} on node {node} died during {method} ({reason}); the "
                         f"other ranks were stopped: see that node's Ray logs (ray logs), then run the command again "
                         f"to resume from the last checkpoint", rank=rank, node=node)


def place_ranks(cfg):
    """A Ray placement group with one bundle per rank ({CPU: num_cpus_per_worker, GPU: num_gpus_per_worker} and
    `resources_per_worker`), placed by `cfg.placement_strategy`; waits `cfg.placement_timeout_s` for it, else a
    `PlacementError` that names the unplaced bundles and what each node offers of the resources they ask for."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    bundle = {"CPU": cfg.num_cpus_per_worker, **cfg.resources_per_worker}
    if cfg.num_gpus_per_worker:
        bundle["GPU"] = cfg.num_gpus_per_worker
    group = placement_group([dict(bundle) for _ in range(cfg.world_size)], strategy=cfg.placement_strategy)
    ready, _ = ray.wait([group.ready()], timeout=cfg.placement_timeout_s)
    if ready:
        return group
    table = placement_group_table(group)
    placed = {i for i, node in table.get("bundles_to_node_id", {}).items() if node}
    missing = [i for i in range(cfg.world_size) if i not in placed]
    ray.util.remove_placement_group(group)
    nodes = []
    for node in ray.nodes():
        if node["Alive"]:
            offers = ", ".join(f"{k}: {node['Resources'].get(k, 0):g}" for k in bundle)
            nodes.append(f"{node['NodeManagerAddress']} {{{offers}}}")
    raise PlacementError(f"the trainer's {cfg.world_size} ranks ({cfg.nnodes} nodes x {cfg.ranks_per_node()}, "
                       f"{cfg.placement_strategy}, one bundle {bundle} each) were not placed within "
                       f"placement_timeout_s={cfg.placement_timeout_s:g}: bundles {missing} unplaced; the cluster "
                       f"has {len(nodes)} nodes: {'; '.join(nodes)}. Add nodes or lower the per-rank resources")


__all__ = ["FSDPGroup", "FSDPWorker", "PlacementError", "RankDiedError", "lr_factor", "place_ranks", "rank_threads",
           "start_ray"]
