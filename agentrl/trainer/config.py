"""Training configuration: the trainer's own sections and the top-level `TrainConfig` that composes every
component's dataclass.

Knob names follow verl's (`ppo_mini_batch_size`, `clip_ratio_low`, `kl_loss_coef`, `loss_agg_mode`, ...) so a
verl user can read a config without a glossary, but the tree is shallow: one section per component.

Batch-size units (the usual source of confusion):
- `data.train_batch_size` counts prompts per RL step; the step trains on `train_batch_size * rollout.n`
  trajectories (fewer when infra-failed episodes or zero-variance groups are dropped).
- `actor.ppo_mini_batch_size` counts prompts too: one optimizer step sees `ppo_mini_batch_size * rollout.n`
  trajectories.
- micro-batches only accumulate gradients: `actor.max_tokens_per_micro_batch` (padded tokens per rank per
  forward) or, when it is null, `actor.ppo_micro_batch_size` trajectories per rank per forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.inference.config import EngineConfig
from agentrl.tools.config import ToolsConfig

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k3+", "low_var_kl+")


@dataclass
class ModelConfig:
    """The policy model (an HF causal-LM directory) and how the trainer holds it."""

    path: str = ""  # HF model dir (config.json + weights + tokenizer), e.g. the output of `agentrl init-model`
    tokenizer_path: str | None = None  # None: the model dir
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # parameter dtype kept by the optimizer
    # GPU only: FSDP2 mixed precision (compute dtype); parameters and optimizer states stay in `dtype`.
    mixed_precision: Literal["none", "bfloat16", "float16"] = "none"
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, ~30% slower)
    attn_implementation: str = "sdpa"  # "sdpa" | "eager" | "flash_attention_2" (GPU)

    def __post_init__(self) -> None:
        if self.dtype != "float32" and self.mixed_precision != "none":
            raise ValueError("model.mixed_precision needs model.dtype float32 (fp32 master weights); "
                             f"got dtype={self.dtype!r}, mixed_precision={self.mixed_precision!r}")


@dataclass
class DataConfig:
    """Where tasks come from (`agentrl.data.tasks.load_tasks`: jsonl or parquet, project or verl-style rows)."""

    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    train_batch_size: int = 8  # prompts per RL step (each rolled out rollout.n times)
    val_batch_size: int | None = None  # prompts evaluated per validation; None: every val task
    shuffle: bool = True  # reshuffle the training tasks every epoch (seeded by `seed`)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.train_batch_size < 1:
            raise ValueError(f"data.train_batch_size must be >= 1 (prompts per step), got {self.train_batch_size}")
        if self.val_batch_size is not None and self.val_batch_size < 1:
            raise ValueError(f"data.val_batch_size must be >= 1 or null, got {self.val_batch_size}")


@dataclass
class ActorConfig:
    """The policy update: optimizer, batch slicing and the PPO/GRPO loss knobs."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0  # RL steps of linear warmup (the schedule advances once per update_policy call)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    grad_clip: float = 1.0  # max global grad norm; a non-finite norm skips the optimizer step
    ppo_mini_batch_size: int = 8  # prompts per optimizer step (x rollout.n trajectories)
    ppo_micro_batch_size: int = 4  # trajectories per rank per forward, used when max_tokens_per_micro_batch is null
    max_tokens_per_micro_batch: int | None = 8192  # padded tokens per rank per forward (length-sorted buckets)
    ppo_epochs: int = 1
    shuffle: bool = True  # shuffle trajectories before cutting mini-batches (seeded per step)
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2  # DAPO clip-higher: e.g. 0.28
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages, > 1
    loss_agg_mode: Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                           "seq-mean-token-sum-norm"] = "token-mean"
    loss_scale_factor: float | None = None  # C of seq-mean-token-sum-norm (e.g. max response length)
    use_kl_loss: bool = False  # keeps a frozen reference policy and adds kl_loss_coef * agg(kl) to the loss
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    calculate_entropy: bool = True  # report entropy even when entropy_coeff is 0 (one extra reduction)
    world_size: int = 1  # FSDP ranks (Ray actors); gloo on CPU, NCCL on GPU
    num_cpus_per_worker: float = 1.0  # Ray CPU resource per rank
    num_gpus_per_worker: float = 0.0  # 1.0 on GPU clusters
    num_threads_per_worker: int | None = None  # torch intra-op threads per rank; None: 1 when world_size > 1

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"actor.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2:
            raise ValueError(f"actor.betas must hold two numbers, got {self.betas}")
        if self.warmup_steps < 0:
            raise ValueError(f"actor.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.grad_clip <= 0:
            raise ValueError(f"actor.grad_clip must be > 0, got {self.grad_clip}")
        if self.ppo_mini_batch_size < 1 or self.ppo_micro_batch_size < 1 or self.ppo_epochs < 1:
            raise ValueError("actor.ppo_mini_batch_size, actor.ppo_micro_batch_size and actor.ppo_epochs must be >= 1")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise ValueError(f"actor.max_tokens_per_micro_batch must be >= 1 or null, got {self.max_tokens_per_micro_batch}")
        if not (0 <= self.clip_ratio_low < 1) or self.clip_ratio_high < 0:
            raise ValueError(f"actor.clip_ratio_low must be in [0, 1) and clip_ratio_high >= 0, got "
                             f"{self.clip_ratio_low}, {self.clip_ratio_high}")
        if self.clip_ratio_c <= 1:
            raise ValueError(f"actor.clip_ratio_c (dual clip) must be > 1, got {self.clip_ratio_c}")
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_scale_factor is None:
            raise ValueError("actor.loss_agg_mode 'seq-mean-token-sum-norm' needs actor.loss_scale_factor (e.g. the "
                             "max response length): without it the objective would depend on micro-batching")
        if self.loss_scale_factor is not None and self.loss_scale_factor <= 0:
            raise ValueError(f"actor.loss_scale_factor must be > 0, got {self.loss_scale_factor}")
        if self.kl_loss_type not in KL_TYPES:
            raise ValueError(f"actor.kl_loss_type {self.kl_loss_type!r} is not one of {', '.join(KL_TYPES)}")
        if self.world_size < 1:
            raise ValueError(f"actor.world_size must be >= 1, got {self.world_size}")


@dataclass
class AlgorithmConfig:
    adv_estimator: Literal["grpo"] = "grpo"
    norm_adv_by_std_in_grpo: bool = True  # False: Dr.GRPO (advantage = score - group mean)
    # DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and refill from new tasks.
    filter_zero_variance_groups: bool = False
    max_filter_rounds: int = 3  # extra rollout rounds per step when refilling; then train on what is left


@dataclass
class TrainerConfig:
    total_steps: int = 10  # RL steps
    # config.yaml (+ config.resume-<step>.yaml), metrics.jsonl, episodes.jsonl, checkpoints/, final_model/, COMPLETE
    run_dir: str = "runs/default"
    test_freq: int = 0  # validate every N steps (and before step 1 and after the last); 0: never
    save_freq: int = 0  # checkpoint every N steps (and after the last); 0: never
    keep_checkpoints: int = 2  # newest complete checkpoints kept on disk; 0: keep all
    # "auto": latest complete checkpoint in run_dir (a finished run is not rerun) | "never": start over (an earlier
    # run in run_dir is moved aside) | a checkpoint dir. Rules: agentrl.trainer.resume
    resume: str = "auto"
    seed: int = 0
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # + "tensorboard", "wandb"
    project: str = "agentrl"  # W&B project
    experiment: str = ""  # W&B / TensorBoard run name; "" -> run_dir's name
    deterministic: bool = False  # torch deterministic algorithms + seeded sampling (CPU resume equivalence)
    val_n: int = 1  # samples per validation task
    val_temperature: float = 0.0  # 0: greedy validation
    ray_address: str | None = None  # None: start a local Ray; "auto" or an address: join a cluster
    ray_num_cpus: int | None = None  # local Ray only; None: Ray's default
    save_hf_model: bool = True  # after the last step, write the trained policy as an HF model to run_dir/final_model

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"trainer.total_steps must be >= 1, got {self.total_steps}")
        if self.test_freq < 0 or self.save_freq < 0 or self.keep_checkpoints < 0:
            raise ValueError("trainer.test_freq, trainer.save_freq and trainer.keep_checkpoints must be >= 0")
        allowed = {"console", "jsonl", "tensorboard", "wandb"}
        bad = [name for name in self.loggers if name not in allowed]
        if bad:
            raise ValueError(f"trainer.loggers: unknown {bad}; choose from {sorted(allowed)}")
        if self.val_n < 1:
            raise ValueError(f"trainer.val_n must be >= 1, got {self.val_n}")


@dataclass
class TrainConfig:
    """Everything `agentrl train CONFIG` needs; see configs/*.yaml for annotated examples."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            raise ValueError(f"data.train_batch_size ({self.data.train_batch_size}) must be a multiple of "
                             f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}); both count prompts")


__all__ = [
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "ActorConfig",
    "AlgorithmConfig",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
]
