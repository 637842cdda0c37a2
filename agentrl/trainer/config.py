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

import logging
from dataclasses import dataclass, field
from typing import Literal, get_args

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.inference.config import EngineConfig
from agentrl.tools.config import ToolsConfig
from agentrl.trainer.algos import (
    AGG_MODES,
    KL_KINDS,
    NEEDS_CRITIC,
    NEEDS_OLD_LOGPROBS,
    PolicyLossKnobs,
    resolve_adv_estimator,
    resolve_policy_loss,
)

log = logging.getLogger(__name__)

LOSS_AGG_MODES = AGG_MODES
KL_TYPES = KL_KINDS
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
assert get_args(LossAggMode) == AGG_MODES, "LossAggMode must list agentrl.trainer.algos.AGG_MODES"


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
    # prompts per rollout round with algorithm.filter_zero_variance_groups (verl's DAPO key): more than
    # train_batch_size oversamples, so one round usually yields enough groups with signal instead of several
    # sequential refill rounds (null: train_batch_size). Later rounds scale the missing count the same way.
    gen_batch_size: int | None = None
    val_batch_size: int | None = None  # prompts evaluated per validation; None: every val task
    shuffle: bool = True  # reshuffle the training tasks every epoch (seeded by `seed`)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.train_batch_size < 1:
            raise ValueError(f"data.train_batch_size must be >= 1 (prompts per step), got {self.train_batch_size}")
        if self.val_batch_size is not None and self.val_batch_size < 1:
            raise ValueError(f"data.val_batch_size must be >= 1 or null, got {self.val_batch_size}")
        if self.gen_batch_size is not None and self.gen_batch_size < self.train_batch_size:
            raise ValueError(f"data.gen_batch_size ({self.gen_batch_size}) must be >= data.train_batch_size "
                             f"({self.train_batch_size}) or null")


@dataclass
class PolicyLossConfig:
    """`actor.policy_loss`: which policy-gradient loss, and the knobs of the losses that have their own (verl's
    names and defaults). The clip ranges of vanilla / gspo / cispo / clip_cov are actor.clip_ratio_low/high."""

    # vanilla | gspo | cispo | clip_cov | kl_cov | reinforce (agentrl.trainer.algos.POLICY_LOSSES) or module:function
    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002  # clip_cov: share of tokens whose gradient is dropped
    clip_cov_lb: float = 1.0  # clip_cov: covariance band [lb, ub] the dropped tokens are drawn from
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # kl_cov: share of tokens (largest covariance) given the |log ratio| penalty
    ppo_kl_coef: float = 0.1  # kl_cov: coefficient of that penalty

    def __post_init__(self) -> None:
        resolve_policy_loss(self.loss_mode)
        if not 0 < self.clip_cov_ratio <= 1 or not 0 < self.kl_cov_ratio <= 1:
            raise ValueError(f"actor.policy_loss.clip_cov_ratio and kl_cov_ratio must be in (0, 1], got "
                             f"{self.clip_cov_ratio}, {self.kl_cov_ratio}")
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"actor.policy_loss.clip_cov_lb ({self.clip_cov_lb}) must be below clip_cov_ub "
                             f"({self.clip_cov_ub})")
        if self.ppo_kl_coef < 0:
            raise ValueError(f"actor.policy_loss.ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")



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
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: LossAggMode = "token-mean"
    loss_scale_factor: float | None = None  # C of seq-mean-token-sum-norm (e.g. max response length)
    use_kl_loss: bool = False  # keeps a frozen reference policy and adds kl_loss_coef * agg(kl) to the loss
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    calculate_entropy: bool = True  # report entropy even when entropy_coeff is 0 (one extra reduction)
    world_size: int = 1  # FSDP ranks (Ray actors); gloo on CPU, NCCL on GPU
    num_cpus_per_worker: float = 1.0  # Ray CPU resource per rank
    num_gpus_per_worker: float = 0.0  # 1.0 on GPU clusters
    num_threads_per_worker: int | None = None  # torch intra-op threads per rank; None: host cores // world_size
    # Speed-ups that leave every loss and gradient unchanged (tests/unit/trainer/test_step_speedups.py):
    fast_logprobs: bool = True  # LM head only at the loss tokens' positions (not prompts, tool observations)
    reuse_old_logprobs: bool = True  # pi_old from the update's own first forward when that is provably pi_old
    # rows of a micro-batch with the same prompt (a GRPO group) run it through the layers once and share its K/V:
    # the same logprobs and gradients to float rounding, fewer tokens (sdpa and eager attention; fast_logprobs)
    share_prompt_prefix: bool = True

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

    def policy_loss_knobs(self) -> PolicyLossKnobs:
        """The policy-loss knobs of this config (clip ranges and `policy_loss.*`), as every loss mode receives them."""
        p = self.policy_loss
        return PolicyLossKnobs(
            clip_ratio_low=self.clip_ratio_low, clip_ratio_high=self.clip_ratio_high, clip_ratio_c=self.clip_ratio_c,
            clip_cov_ratio=p.clip_cov_ratio, clip_cov_lb=p.clip_cov_lb, clip_cov_ub=p.clip_cov_ub,
            kl_cov_ratio=p.kl_cov_ratio, ppo_kl_coef=p.ppo_kl_coef)


@dataclass
class KLControlConfig:
    """`algorithm.kl_ctrl`: the coefficient beta of the reward-side KL (`algorithm.use_kl_in_reward`)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001  # beta (the starting beta when adaptive)
    target_kl: float = 0.1  # adaptive: the KL per token beta steers towards
    horizon: int = 10000  # adaptive: trajectories over which beta may change by a factor of about e^0.2

    def __post_init__(self) -> None:
        if self.kl_coef < 0:
            raise ValueError(f"algorithm.kl_ctrl.kl_coef must be >= 0, got {self.kl_coef}")
        if self.type == "adaptive" and (self.target_kl <= 0 or self.horizon < 1):
            raise ValueError(f"algorithm.kl_ctrl (adaptive) needs target_kl > 0 and horizon >= 1, got "
                             f"target_kl={self.target_kl}, horizon={self.horizon}")


@dataclass
class RejectionConfig:
    """`algorithm.rollout_correction.rejection`: drop tokens, or whole trajectories, whose pi_old / pi_rollout
    ratio leaves [lower, upper] (token: each token's ratio; sequence: the product over the trajectory;
    geometric: exp(mean log ratio) over the trajectory). null level: no rejection."""

    level: Literal["token", "sequence", "geometric"] | None = None
    lower: float | None = None
    upper: float | None = None

    def __post_init__(self) -> None:
        if self.level is None:
            return
        if self.lower is None or self.upper is None or not 0 < self.lower < self.upper:
            raise ValueError(f"algorithm.rollout_correction.rejection with level {self.level!r} needs 0 < lower < "
                             f"upper, got lower={self.lower}, upper={self.upper}")


@dataclass
class RolloutCorrectionConfig:
    """`algorithm.rollout_correction`: importance weights pi_old / pi_rollout on the policy-gradient token losses
    ("Policy 与 Value Update", §2-3). level null: off. mode truncate (TIS): w = min(w, threshold); mask (IcePop):
    w = 0 outside [lower, upper] (defaults 1/threshold and threshold). bypass_mode: old_logp := rollout_logp (no
    recompute)."""

    level: Literal["token", "sequence"] | None = None
    mode: Literal["truncate", "mask"] = "truncate"
    threshold: float = 2.0
    lower: float | None = None
    upper: float | None = None
    rejection: RejectionConfig = field(default_factory=RejectionConfig)
    bypass_mode: bool = False

    def __post_init__(self) -> None:
        if self.threshold <= 0:
            raise ValueError(f"algorithm.rollout_correction.threshold must be > 0, got {self.threshold}")
        lower, upper = self.band
        if not 0 <= lower < upper:
            raise ValueError(f"algorithm.rollout_correction: the mask band needs 0 <= lower < upper, got "
                             f"lower={lower}, upper={upper}")

    @property
    def band(self) -> tuple[float, float]:
        """(lower, upper) of mask mode, defaults filled in."""
        upper = self.threshold if self.upper is None else self.upper
        return (1.0 / upper if self.lower is None else self.lower), upper

    @property
    def is_threshold(self) -> float | tuple[float, float]:
        """The `threshold` argument of `algos.rollout_is_weights` for this config."""
        return self.band if self.mode == "mask" else self.threshold


@dataclass
class AlgorithmConfig:
    # gae | grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline (algos.ADV_ESTIMATORS) or module:function
    adv_estimator: str = "grpo"
    gamma: float = 1.0  # discount (gae, reinforce_plus_plus)
    lam: float = 1.0  # GAE lambda
    norm_adv_by_std_in_grpo: bool = True  # False: Dr.GRPO (advantage = score - group mean)
    use_kl_in_reward: bool = False  # token rewards -= beta * kl_penalty(old_logp, ref_logp) (needs the reference)
    kl_penalty: str = "kl"  # estimator of the reward-side KL (same kinds as actor.kl_loss_type)
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    mask_truncated: bool = False  # leave responses cut by the length budget out of the loss (overlong filtering)
    # DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and refill from new tasks.
    filter_zero_variance_groups: bool = False
    max_filter_rounds: int = 3  # extra rollout rounds per step when refilling; then train on what is left

    def __post_init__(self) -> None:
        resolve_adv_estimator(self.adv_estimator)
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ValueError(f"algorithm.gamma and algorithm.lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.kl_penalty not in KL_TYPES:
            raise ValueError(f"algorithm.kl_penalty {self.kl_penalty!r} is not one of {', '.join(KL_TYPES)}")
        if self.max_filter_rounds < 0:
            raise ValueError(f"algorithm.max_filter_rounds must be >= 0, got {self.max_filter_rounds}")

    @property
    def needs_critic(self) -> bool:
        return self.adv_estimator in NEEDS_CRITIC


@dataclass
class CriticModelConfig:
    path: str | None = None  # HF model dir; None: initialise from the policy (model.path) with a fresh value head


@dataclass
class CriticConfig:
    """The value model for GAE: its optimizer, batch slicing and clipped value loss (verl's `critic:` names)."""

    enable: bool | None = None  # None: on exactly when algorithm.adv_estimator needs values (gae)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0  # RL steps of linear warmup, as actor.warmup_steps
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    ppo_mini_batch_size: int | None = None  # prompts per critic optimizer step; None: actor.ppo_mini_batch_size
    ppo_micro_batch_size: int = 4  # trajectories per rank per forward when max_tokens_per_micro_batch is null
    max_tokens_per_micro_batch: int | None = 8192
    ppo_epochs: int | None = None  # None: actor.ppo_epochs
    shuffle: bool = True
    cliprange_value: float = 0.5  # value clip around the pre-update values (verl default)
    loss_agg_mode: LossAggMode | None = None  # None: actor.loss_agg_mode
    loss_scale_factor: float | None = None  # None: actor.loss_scale_factor
    world_size: int = 1
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.grad_clip <= 0:
            raise ValueError(f"critic.lr and critic.grad_clip must be > 0, got {self.lr}, {self.grad_clip}")
        if len(self.betas) != 2:
            raise ValueError(f"critic.betas must hold two numbers, got {self.betas}")
        if self.warmup_steps < 0:
            raise ValueError(f"critic.warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("ppo_mini_batch_size", "ppo_epochs", "max_tokens_per_micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"critic.{name} must be >= 1 or null, got {value}")
        if self.ppo_micro_batch_size < 1 or self.world_size < 1:
            raise ValueError("critic.ppo_micro_batch_size and critic.world_size must be >= 1")
        if self.cliprange_value < 0:
            raise ValueError(f"critic.cliprange_value must be >= 0, got {self.cliprange_value}")
        if self.loss_scale_factor is not None and self.loss_scale_factor <= 0:
            raise ValueError(f"critic.loss_scale_factor must be > 0, got {self.loss_scale_factor}")


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
    # Stop the run (exit code 3) when its infrastructure fails (a tool service, the sandbox or an engine unreachable
    # or failing after the clients' retries; such episodes are always dropped, never trained as reward 0): when
    # more than max_infra_failed_fraction of one step's episodes failed (1.0: never), or when infra_streak_steps
    # steps in a row each had more than infra_streak_fraction failed (0 steps: never). Rules: trainer/stops.py
    max_infra_failed_fraction: float = 0.5
    infra_streak_fraction: float = 0.25
    infra_streak_steps: int = 3

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
        for key in ("max_infra_failed_fraction", "infra_streak_fraction"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"trainer.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.infra_streak_steps < 0:
            raise ValueError(f"trainer.infra_streak_steps must be >= 0 (0: off), got {self.infra_streak_steps}")


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
    critic: CriticConfig = field(default_factory=CriticConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            raise ValueError(f"data.train_batch_size ({self.data.train_batch_size}) must be a multiple of "
                             f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}); both count prompts")
        if (self.data.gen_batch_size or 0) > self.data.train_batch_size \
                and not self.algorithm.filter_zero_variance_groups:
            raise ValueError(f"data.gen_batch_size ({self.data.gen_batch_size}) > data.train_batch_size only serves "
                             "dynamic sampling: set algorithm.filter_zero_variance_groups=true, or drop "
                             "data.gen_batch_size (the extra groups would be generated and thrown away)")
        _check_algorithm(self)
        _resolve_critic(self)
        if self.reward.overlong_buffer.enable and self.reward.overlong_buffer.len > self.agent.max_response_tokens:
            raise ValueError(f"reward.overlong_buffer.len ({self.reward.overlong_buffer.len}) must be <= "
                             f"agent.max_response_tokens ({self.agent.max_response_tokens}): the penalty starts at "
                             f"max_response_tokens - len")


def _check_algorithm(cfg: TrainConfig) -> None:
    """Combinations of algorithm / actor keys that cannot work (errors) or are rarely meant (warnings)."""
    alg, loss_mode = cfg.algorithm, cfg.actor.policy_loss.loss_mode
    corr = alg.rollout_correction
    if corr.bypass_mode and loss_mode in NEEDS_OLD_LOGPROBS and corr.level is not None:
        raise ValueError(
            f"algorithm.rollout_correction.bypass_mode=true sets old_logp = rollout_logp, so the importance weights "
            f"of rollout_correction.level={corr.level!r} (pi_old / pi_rollout) are all 1 and "
            f"actor.policy_loss.loss_mode={loss_mode!r} already takes its ratio against pi_rollout: set "
            f"rollout_correction.level=null, or loss_mode=reinforce (REINFORCE with importance weights), or "
            f"bypass_mode=false")
    if alg.use_kl_in_reward and cfg.actor.use_kl_loss:
        log.warning("algorithm.use_kl_in_reward and actor.use_kl_loss are both true: the reference KL is applied "
                    "twice (once in the rewards, once in the loss); set one of them false unless that is intended")
    if loss_mode == "gspo" and max(cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high) > 0.01:
        log.warning("actor.policy_loss.loss_mode=gspo clips a sequence-level ratio: its clip ranges are ~1e-3 "
                    "(paper: actor.clip_ratio_low=3e-4, clip_ratio_high=4e-4), got %s / %s",
                    cfg.actor.clip_ratio_low, cfg.actor.clip_ratio_high)


def _resolve_critic(cfg: TrainConfig) -> None:
    """critic.enable and the critic keys that default to the actor's, resolved (written back, so the saved
    config shows what ran)."""
    critic, needs = cfg.critic, cfg.algorithm.needs_critic
    if critic.enable is False and needs:
        raise ValueError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} needs critic values, but "
                         f"critic.enable is false: set critic.enable=true (or null), or pick an estimator without a "
                         f"critic (grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline)")
    if critic.enable and not needs:
        log.warning("critic.enable is true but algorithm.adv_estimator=%r does not read values: the critic is "
                    "trained and unused", cfg.algorithm.adv_estimator)
    critic.enable = needs if critic.enable is None else critic.enable
    if critic.ppo_mini_batch_size is None:
        critic.ppo_mini_batch_size = cfg.actor.ppo_mini_batch_size
    if critic.ppo_epochs is None:
        critic.ppo_epochs = cfg.actor.ppo_epochs
    if critic.loss_agg_mode is None:
        critic.loss_agg_mode = cfg.actor.loss_agg_mode
    if critic.loss_scale_factor is None:
        critic.loss_scale_factor = cfg.actor.loss_scale_factor
    if critic.enable and cfg.data.train_batch_size % critic.ppo_mini_batch_size:
        raise ValueError(f"data.train_batch_size ({cfg.data.train_batch_size}) must be a multiple of "
                         f"critic.ppo_mini_batch_size ({critic.ppo_mini_batch_size}); both count prompts")
    if critic.enable and critic.loss_agg_mode == "seq-mean-token-sum-norm" and critic.loss_scale_factor is None:
        raise ValueError("critic.loss_agg_mode 'seq-mean-token-sum-norm' needs critic.loss_scale_factor (or "
                         "actor.loss_scale_factor)")


__all__ = [
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "ActorConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "CriticModelConfig",
    "KLControlConfig",
    "PolicyLossConfig",
    "RejectionConfig",
    "RolloutCorrectionConfig",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
]
