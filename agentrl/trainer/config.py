"""Training configuration: the trainer's own sections and the top-level `TrainConfig` that composes every
component's model.

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
from typing import Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from agentrl.agent_loop.config import AgentLoopConfig, RewardConfig, RolloutConfig
from agentrl.config import ConfigModel, tagged_union
from agentrl.inference.config import EngineConfig
from agentrl.tools.config import ToolsConfig
from agentrl.trainer.algos import (
    NEEDS_CRITIC,
    NEEDS_OLD_LOGPROBS,
    KLKind,
    LossAggMode,
    PolicyLossKnobs,
    resolve_adv_estimator,
    resolve_policy_loss,
)

log = logging.getLogger(__name__)


class ModelConfig(ConfigModel):
    """The policy model (an HF causal-LM directory) and how the trainer holds it."""

    path: str = ""  # HF model dir (config.json + weights + tokenizer), e.g. the output of `agentrl init-model`
    tokenizer_path: str | None = None  # None: the model dir
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # parameter dtype kept by the optimizer
    # GPU only: FSDP2 mixed precision (compute dtype); parameters and optimizer states stay in `dtype`.
    mixed_precision: Literal["none", "bfloat16", "float16"] = "none"
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, ~30% slower)
    attn_implementation: str = "sdpa"  # "sdpa" | "eager" | "flash_attention_2" (GPU)

    @model_validator(mode="after")
    def _fp32_master_weights(self) -> ModelConfig:
        if self.dtype != "float32" and self.mixed_precision != "none":
            raise ValueError("model.mixed_precision needs model.dtype float32 (fp32 master weights); "
                             f"got dtype={self.dtype!r}, mixed_precision={self.mixed_precision!r}")
        return self


class DataConfig(ConfigModel):
    """Where tasks come from (`agentrl.data.tasks.load_tasks`: jsonl or parquet, project or verl-style rows)."""

    train_files: list[str] = Field(default_factory=list)
    val_files: list[str] = Field(default_factory=list)
    train_batch_size: int = Field(8, ge=1)  # prompts per RL step (each rolled out rollout.n times)
    # prompts per rollout round with algorithm.filter_zero_variance_groups (verl's DAPO key): more than
    # train_batch_size oversamples, so one round usually yields enough groups with signal instead of several
    # sequential refill rounds (null: train_batch_size). Later rounds scale the missing count the same way.
    gen_batch_size: int | None = None
    val_batch_size: int | None = Field(None, ge=1)  # prompts evaluated per validation; None: every val task
    shuffle: bool = True  # reshuffle the training tasks every epoch (seeded by `seed`)
    seed: int = 0

    @model_validator(mode="after")
    def _gen_batch_covers_train_batch(self) -> DataConfig:
        if self.gen_batch_size is not None and self.gen_batch_size < self.train_batch_size:
            raise ValueError(f"data.gen_batch_size ({self.gen_batch_size}) must be >= data.train_batch_size "
                             f"({self.train_batch_size}) or null")
        return self


# --------------------------------------------------------------------------- actor.policy_loss: one model per mode
# The clip ranges of vanilla / gspo / cispo / clip_cov are actor.clip_ratio_low/high (and clip_ratio_c).


class VanillaLoss(ConfigModel):
    """PPO's clipped surrogate with dual clip."""

    loss_mode: Literal["vanilla"] = "vanilla"


class GspoLoss(ConfigModel):
    """GSPO: the clipped sequence-level ratio (its clip ranges are ~1e-3)."""

    loss_mode: Literal["gspo"] = "gspo"


class CispoLoss(ConfigModel):
    """CISPO: REINFORCE with clipped, stop-gradient importance weights."""

    loss_mode: Literal["cispo"] = "cispo"


class ClipCovKnobs(ConfigModel):
    """The knobs of clip_cov (a module:function loss receives them too)."""

    clip_cov_ratio: float = Field(0.0002, gt=0, le=1)  # share of tokens whose gradient is dropped
    clip_cov_lb: float = 1.0  # covariance band [lb, ub] the dropped tokens are drawn from
    clip_cov_ub: float = 5.0

    @model_validator(mode="after")
    def _band(self) -> ClipCovKnobs:
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"actor.policy_loss.clip_cov_lb ({self.clip_cov_lb}) must be below clip_cov_ub "
                             f"({self.clip_cov_ub})")
        return self


class KlCovKnobs(ConfigModel):
    """The knobs of kl_cov (a module:function loss receives them too)."""

    kl_cov_ratio: float = Field(0.0002, gt=0, le=1)  # share of tokens (largest covariance) given the penalty
    ppo_kl_coef: float = Field(0.1, ge=0)  # coefficient of that penalty


class ClipCovLoss(ClipCovKnobs):
    """Clip-Cov: the clipped surrogate with the gradient of a few high-covariance tokens dropped."""

    loss_mode: Literal["clip_cov"] = "clip_cov"


class KlCovLoss(KlCovKnobs):
    """KL-Cov: the unclipped surrogate plus a |log ratio| penalty on the highest-covariance tokens."""

    loss_mode: Literal["kl_cov"] = "kl_cov"


class ReinforceLoss(ConfigModel):
    """REINFORCE with importance weights (for rollout_correction.bypass_mode)."""

    loss_mode: Literal["reinforce"] = "reinforce"


class CustomLoss(ClipCovKnobs, KlCovKnobs):
    """A `package.module:function` loss: it receives every knob (`PolicyLossKnobs`)."""

    loss_mode: str

    @field_validator("loss_mode")
    @classmethod
    def _importable(cls, name: str) -> str:
        resolve_policy_loss(name)  # an unknown built-in name or a bad module:function fails here, naming the key
        return name


# `actor.policy_loss`, keyed on loss_mode (verl's names and defaults); a knob of another mode is an error naming it.
PolicyLossConfig = tagged_union("loss_mode", VanillaLoss, GspoLoss, CispoLoss, ClipCovLoss, KlCovLoss, ReinforceLoss,
                                other=CustomLoss)


# ----------------------------------------------------------------- what the actor and the critic share: one model each


class OptimizerConfig(ConfigModel):
    """AdamW and its learning-rate schedule (`agentrl.trainer.fsdp`)."""

    lr: float = Field(1e-6, gt=0)
    weight_decay: float = 0.01
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2)
    warmup_steps: int = Field(0, ge=0)  # RL steps of linear warmup (the schedule advances once per update call)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0  # cosine floor as a fraction of lr
    grad_clip: float = Field(1.0, gt=0)  # max global grad norm; a non-finite norm skips the optimizer step


class MiniBatchConfig(ConfigModel):
    """How one update slices the step's trajectories (module docstring: batch-size units)."""

    ppo_mini_batch_size: int = Field(8, ge=1)  # prompts per optimizer step (x rollout.n trajectories)
    ppo_micro_batch_size: int = Field(4, ge=1)  # trajectories per rank per forward (max_tokens_per_micro_batch null)
    max_tokens_per_micro_batch: int | None = Field(8192, ge=1)  # padded tokens per rank per forward (length-sorted)
    ppo_epochs: int = Field(1, ge=1)
    shuffle: bool = True  # shuffle trajectories before cutting mini-batches (seeded per step)


class WorkerResources(ConfigModel):
    """The FSDP ranks of one role (Ray actors)."""

    world_size: int = Field(1, ge=1)  # FSDP ranks; gloo on CPU, NCCL on GPU
    num_cpus_per_worker: float = 1.0  # Ray CPU resource per rank
    num_gpus_per_worker: float = 0.0  # 1.0 on GPU clusters
    resources_per_worker: dict[str, float] = Field(default_factory=dict)  # custom Ray resources, e.g. {trainer_slot: 1}
    # Placement over a Ray cluster (docs/scaling.md, "Trainer placement"). nnodes > 1: one placement-group bundle
    # per rank ({CPU: num_cpus_per_worker, GPU: num_gpus_per_worker, **resources_per_worker}) placed by
    # placement_strategy, with
    # nnodes * workers_per_node == world_size. nnodes 1: the ranks are plain Ray actors, as Ray schedules them.
    nnodes: int = Field(1, ge=1)
    workers_per_node: int | None = Field(None, ge=1)  # None: world_size // nnodes
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    placement_timeout_s: float = Field(300.0, gt=0)  # bundles not placed by then: an error naming them

    @model_validator(mode="after")
    def _ranks_fill_nodes(self) -> WorkerResources:
        per_node = self.workers_per_node if self.workers_per_node is not None else self.world_size // self.nnodes
        if self.nnodes * per_node != self.world_size:
            raise ValueError(f"nnodes ({self.nnodes}) * workers_per_node ({per_node}) must equal world_size "
                             f"({self.world_size}): set workers_per_node to world_size / nnodes")
        return self

    def ranks_per_node(self) -> int:
        return self.workers_per_node if self.workers_per_node is not None else self.world_size // self.nnodes


# The linear layers of a Qwen2 (and Llama, Mistral, Qwen3) decoder layer that LoRA may adapt.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(ConfigModel):
    """`actor.lora`: train low-rank adapters (peft) instead of the policy's weights; null (the default) trains every
    weight. Each adapted linear layer W computes W x + (alpha / rank) * B A x, with A [rank, in] drawn at random and
    B [out, rank] zero, so step 0 is the base model (`agentrl.trainer.lora`)."""

    rank: int = Field(16, ge=1)  # r
    alpha: float = Field(32.0, gt=0)  # the update is scaled by alpha / rank
    dropout: float = Field(0.0, ge=0, lt=1)  # on the adapter input; > 0: pi_old needs its own no-grad pass
    # which linear layers of every decoder layer get an adapter; "all-linear" is all seven (not the LM head)
    target_modules: list[str] | Literal["all-linear"] = Field(default_factory=lambda: list(LORA_TARGETS))

    @field_validator("target_modules")
    @classmethod
    def _known_modules(cls, names):
        if names == "all-linear":
            return names
        unknown = [name for name in names if name not in LORA_TARGETS]
        if not names or unknown:
            raise ValueError(f"actor.lora.target_modules must be a non-empty list of {', '.join(LORA_TARGETS)}, or "
                             f"'all-linear'; got {names!r}")
        return names

    def module_names(self) -> list[str]:
        """The target modules as a list of names."""
        return list(LORA_TARGETS) if self.target_modules == "all-linear" else list(self.target_modules)


class ActorConfig(WorkerResources, MiniBatchConfig, OptimizerConfig):
    """The policy update: optimizer, batch slicing, resources and the PPO/GRPO loss knobs."""

    clip_ratio_low: float = Field(0.2, ge=0, lt=1)
    clip_ratio_high: float = Field(0.2, ge=0)  # DAPO clip-higher: e.g. 0.28
    clip_ratio_c: float = Field(3.0, gt=1)  # dual-clip bound on the loss of negative-advantage tokens
    policy_loss: PolicyLossConfig = Field(default_factory=VanillaLoss)
    loss_agg_mode: LossAggMode = "token-mean"
    loss_scale_factor: float | None = Field(None, gt=0)  # C of seq-mean-token-sum-norm (e.g. max response length)
    use_kl_loss: bool = False  # keeps a frozen reference policy and adds kl_loss_coef * agg(kl) to the loss
    kl_loss_coef: float = 0.001
    kl_loss_type: KLKind = "low_var_kl"
    entropy_coeff: float = 0.0
    calculate_entropy: bool = True  # report entropy even when entropy_coeff is 0 (one extra reduction)
    num_threads_per_worker: int | None = None  # torch intra-op threads per rank; None: host cores // world_size
    # Speed-ups that leave every loss and gradient unchanged (tests/unit/trainer/test_step_speedups.py):
    fast_logprobs: bool = True  # LM head only at the loss tokens' positions (not prompts, tool observations)
    reuse_old_logprobs: bool = True  # pi_old from the update's own first forward when that is provably pi_old
    # rows of a micro-batch with the same prompt (a GRPO group) run it through the layers once and share its K/V:
    # the same logprobs and gradients to float rounding, fewer tokens (sdpa and eager attention; fast_logprobs)
    share_prompt_prefix: bool = True
    lora: LoraConfig | None = None  # low-rank adapters instead of full fine-tuning (docs/training.md, "LoRA")

    @model_validator(mode="after")
    def _scale_factor_for_norm(self) -> ActorConfig:
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_scale_factor is None:
            raise ValueError("actor.loss_agg_mode 'seq-mean-token-sum-norm' needs actor.loss_scale_factor (e.g. the "
                             "max response length): without it the objective would depend on micro-batching")
        return self

    def policy_loss_knobs(self) -> PolicyLossKnobs:
        """The policy-loss knobs of this config (clip ranges and `policy_loss.*`), as every loss mode receives them
        (a mode's knobs it does not have keep their defaults)."""
        return PolicyLossKnobs(clip_ratio_low=self.clip_ratio_low, clip_ratio_high=self.clip_ratio_high,
                               clip_ratio_c=self.clip_ratio_c, **self.policy_loss.model_dump(exclude={"loss_mode"}))


# -------------------------------------------------------------------------------------------------- algorithm


class KLControlConfig(ConfigModel):
    """`algorithm.kl_ctrl`: the coefficient beta of the reward-side KL (`algorithm.use_kl_in_reward`)."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = Field(0.001, ge=0)  # beta (the starting beta when adaptive)
    target_kl: float = 0.1  # adaptive: the KL per token beta steers towards
    horizon: int = 10000  # adaptive: trajectories over which beta may change by a factor of about e^0.2

    @model_validator(mode="after")
    def _adaptive_needs_a_target(self) -> KLControlConfig:
        if self.type == "adaptive" and (self.target_kl <= 0 or self.horizon < 1):
            raise ValueError(f"algorithm.kl_ctrl (adaptive) needs target_kl > 0 and horizon >= 1, got "
                             f"target_kl={self.target_kl}, horizon={self.horizon}")
        return self


class RejectionConfig(ConfigModel):
    """`algorithm.rollout_correction.rejection`: drop tokens, or whole trajectories, whose pi_old / pi_rollout
    ratio leaves [lower, upper] (token: each token's ratio; sequence: the product over the trajectory;
    geometric: exp(mean log ratio) over the trajectory). null level: no rejection."""

    level: Literal["token", "sequence", "geometric"] | None = None
    lower: float | None = None
    upper: float | None = None

    @model_validator(mode="after")
    def _band(self) -> RejectionConfig:
        if self.level is not None and (self.lower is None or self.upper is None or not 0 < self.lower < self.upper):
            raise ValueError(f"algorithm.rollout_correction.rejection with level {self.level!r} needs 0 < lower < "
                             f"upper, got lower={self.lower}, upper={self.upper}")
        return self


class RolloutCorrectionConfig(ConfigModel):
    """`algorithm.rollout_correction`: importance weights pi_old / pi_rollout on the policy-gradient token losses
    ("Policy 与 Value Update", §2-3). level null: off. mode truncate (TIS): w = min(w, threshold); mask (IcePop):
    w = 0 outside [lower, upper] (defaults 1/threshold and threshold). bypass_mode: old_logp := rollout_logp (no
    recompute)."""

    level: Literal["token", "sequence"] | None = None
    mode: Literal["truncate", "mask"] = "truncate"
    threshold: float = Field(2.0, gt=0)
    lower: float | None = None
    upper: float | None = None
    rejection: RejectionConfig = Field(default_factory=RejectionConfig)
    bypass_mode: bool = False

    @model_validator(mode="after")
    def _band_is_ordered(self) -> RolloutCorrectionConfig:
        lower, upper = self.band
        if not 0 <= lower < upper:
            raise ValueError(f"algorithm.rollout_correction: the mask band needs 0 <= lower < upper, got "
                             f"lower={lower}, upper={upper}")
        return self

    @property
    def band(self) -> tuple[float, float]:
        """(lower, upper) of mask mode, defaults filled in."""
        upper = self.threshold if self.upper is None else self.upper
        return (1.0 / upper if self.lower is None else self.lower), upper

    @property
    def is_threshold(self) -> float | tuple[float, float]:
        """The `threshold` argument of `algos.rollout_is_weights` for this config."""
        return self.band if self.mode == "mask" else self.threshold


# The estimators that read each of verl's flat estimator knobs; a `module:function` estimator may read them all.
ESTIMATOR_KNOBS = {"gamma": ("gae", "reinforce_plus_plus"), "lam": ("gae",), "norm_adv_by_std_in_grpo": ("grpo",)}


class AlgorithmConfig(ConfigModel):
    # gae | grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline (algos.ADV_ESTIMATORS) or module:function
    adv_estimator: str = "grpo"
    gamma: float = Field(1.0, ge=0, le=1)  # discount (gae, reinforce_plus_plus)
    lam: float = Field(1.0, ge=0, le=1)  # GAE lambda (gae)
    norm_adv_by_std_in_grpo: bool = True  # grpo; False: Dr.GRPO (advantage = score - group mean)
    use_kl_in_reward: bool = False  # token rewards -= beta * kl_penalty(old_logp, ref_logp) (needs the reference)
    kl_penalty: KLKind = "kl"  # estimator of the reward-side KL
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    mask_truncated: bool = False  # leave responses cut by the length budget out of the loss (overlong filtering)
    # DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) and refill from new tasks.
    filter_zero_variance_groups: bool = False
    max_filter_rounds: int = Field(3, ge=0)  # extra rollout rounds per step when refilling; then train on what is left

    @model_validator(mode="before")
    @classmethod
    def _knobs_of_the_estimator(cls, data):
        """A knob no chosen estimator reads is an error, unless it holds its default (configs saved before the
        knobs were tied to their estimators list every knob)."""
        if not isinstance(data, dict):
            return data
        name = data.get("adv_estimator", "grpo")
        unused = _unused_knobs(name) if isinstance(name, str) else ()
        for knob in unused:
            if knob in data and data[knob] != cls.model_fields[knob].default:
                owners = " or ".join(repr(e) for e in ESTIMATOR_KNOBS[knob])
                raise ValueError(f"algorithm.{knob} is read by adv_estimator {owners}, not {name!r}: drop the key, "
                                 f"or choose one of those estimators")
        return {k: v for k, v in data.items() if k not in unused}

    @field_validator("adv_estimator")
    @classmethod
    def _known_estimator(cls, name: str) -> str:
        resolve_adv_estimator(name)
        return name

    @model_serializer(mode="wrap")
    def _dump_used_knobs(self, handler):
        """Leave out the knobs the estimator does not read, so the dump loads back under the same rules."""
        return {k: v for k, v in handler(self).items() if k not in _unused_knobs(self.adv_estimator)}

    @property
    def needs_critic(self) -> bool:
        return self.adv_estimator in NEEDS_CRITIC


def _unused_knobs(estimator: str) -> tuple[str, ...]:
    if ":" in estimator:
        return ()
    return tuple(knob for knob, users in ESTIMATOR_KNOBS.items() if estimator not in users)


# ---------------------------------------------------------------------------------------------------- critic


class CriticModelConfig(ConfigModel):
    path: str | None = None  # HF model dir; None: initialise from the policy (model.path) with a fresh value head


class CriticConfig(WorkerResources, MiniBatchConfig, OptimizerConfig):
    """The value model for GAE: its optimizer, batch slicing, resources and clipped value loss (verl's `critic:`
    names). The keys that default to the actor's are null until `TrainConfig` resolves them."""

    enable: bool | None = None  # None: on exactly when algorithm.adv_estimator needs values (gae)
    model: CriticModelConfig = Field(default_factory=CriticModelConfig)
    lr: float = Field(1e-5, gt=0)
    ppo_mini_batch_size: int | None = Field(None, ge=1)  # prompts per critic optimizer step; None: the actor's
    ppo_epochs: int | None = Field(None, ge=1)  # None: actor.ppo_epochs
    cliprange_value: float = Field(0.5, ge=0)  # value clip around the pre-update values (verl default)
    loss_agg_mode: LossAggMode | None = None  # None: actor.loss_agg_mode
    loss_scale_factor: float | None = Field(None, gt=0)  # None: actor.loss_scale_factor


class TrainerConfig(ConfigModel):
    total_steps: int = Field(10, ge=1)  # RL steps
    # config.yaml (+ config.resume-<step>.yaml), metrics.jsonl, episodes.jsonl, checkpoints/, final_model/, COMPLETE
    run_dir: str = "runs/default"
    test_freq: int = Field(0, ge=0)  # validate every N steps (and before step 1 and after the last); 0: never
    save_freq: int = Field(0, ge=0)  # checkpoint every N steps (and after the last); 0: never
    keep_checkpoints: int = Field(2, ge=0)  # newest complete checkpoints kept on disk; 0: keep all
    # "auto": latest complete checkpoint in run_dir (a finished run is not rerun) | "never": start over (an earlier
    # run in run_dir is moved aside) | a checkpoint dir. Rules: agentrl.trainer.resume
    resume: str = "auto"
    seed: int = 0
    loggers: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["console", "jsonl"])
    project: str = "agentrl"  # W&B project
    experiment: str = ""  # W&B / TensorBoard run name; "" -> run_dir's name
    deterministic: bool = False  # torch deterministic algorithms + seeded sampling (CPU resume equivalence)
    val_n: int = Field(1, ge=1)  # samples per validation task
    val_temperature: float = 0.0  # 0: greedy validation
    ray_address: str | None = None  # None: start a local Ray; "auto" or an address: join a cluster
    ray_num_cpus: int | None = None  # local Ray only; None: Ray's default
    save_hf_model: bool = True  # after the last step, write the trained policy as an HF model to run_dir/final_model
    # Stop the run (exit code 3) when its infrastructure fails (a tool service, the sandbox or an engine unreachable
    # or failing after the clients' retries; such episodes are always dropped, never trained as reward 0): when
    # more than max_infra_failed_fraction of one step's episodes failed (1.0: never), or when infra_streak_steps
    # steps in a row each had more than infra_streak_fraction failed (0 steps: never). Rules: trainer/stops.py
    max_infra_failed_fraction: float = Field(0.5, ge=0, le=1)
    infra_streak_fraction: float = Field(0.25, ge=0, le=1)
    infra_streak_steps: int = Field(3, ge=0)
    # "sync": roll out, train, push weights, in turn. "async": rollouts never stop; the trainer takes groups as they
    # finish and pushes weights without draining the engine (docs/training.md, "Sync and async").
    mode: Literal["sync", "async"] = "sync"
    # async: groups whose oldest policy token is more than this many weight versions behind the trainer are dropped
    # (and counted), and the producer never runs more than this many steps ahead. 1 overlaps the next step's
    # rollout with this step's update, the bulk of the gain; larger values absorb long-tailed episodes at the cost
    # of more off-policy tokens. 0 trains exactly the batches sync mode trains.
    max_staleness: int = Field(1, ge=0)
    weight_sync_timeout_s: float = Field(600.0, gt=0)  # a weight push that takes longer stops the run


class TrainConfig(ConfigModel):
    """Everything `agentrl train CONFIG` needs; see configs/*.yaml for annotated examples."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agent: AgentLoopConfig = Field(default_factory=AgentLoopConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @model_validator(mode="after")
    def _sections_agree(self) -> TrainConfig:
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            raise ValueError(f"data.train_batch_size ({self.data.train_batch_size}) must be a multiple of "
                             f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}); both count prompts")
        if (self.data.gen_batch_size or 0) > self.data.train_batch_size \
                and not self.algorithm.filter_zero_variance_groups:
            raise ValueError(f"data.gen_batch_size ({self.data.gen_batch_size}) > data.train_batch_size only serves "
                             "dynamic sampling: set algorithm.filter_zero_variance_groups=true, or drop "
                             "data.gen_batch_size (the extra groups would be generated and thrown away)")
        if self.engine.lora_sync == "adapter" and self.actor.lora is None:
            raise ValueError("engine.lora_sync=adapter sends the policy's LoRA adapter, but actor.lora is null (full "
                             "fine-tuning): set actor.lora (e.g. actor.lora.rank=16) or leave engine.lora_sync out")
        _check_algorithm(self)
        _resolve_critic(self)
        if self.reward.overlong_buffer.enable and self.reward.overlong_buffer.len > self.agent.max_response_tokens:
            raise ValueError(f"reward.overlong_buffer.len ({self.reward.overlong_buffer.len}) must be <= "
                             f"agent.max_response_tokens ({self.agent.max_response_tokens}): the penalty starts at "
                             f"max_response_tokens - len")
        return self


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
    if cfg.trainer.mode == "async" and not (corr.bypass_mode or corr.level or corr.rejection.level):
        raise ValueError("trainer.mode=async trains on tokens sampled by older weights and needs an off-policy "
                         "correction: set algorithm.rollout_correction.level=token|sequence (mode truncate or mask), "
                         "or algorithm.rollout_correction.rejection.level=token|sequence|geometric (with lower and "
                         "upper), or algorithm.rollout_correction.bypass_mode=true")
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
    "ESTIMATOR_KNOBS",
    "ActorConfig",
    "AlgorithmConfig",
    "CispoLoss",
    "ClipCovLoss",
    "CriticConfig",
    "CriticModelConfig",
    "CustomLoss",
    "GspoLoss",
    "KLControlConfig",
    "KlCovLoss",
    "LORA_TARGETS",
    "LoraConfig",
    "MiniBatchConfig",
    "OptimizerConfig",
    "PolicyLossConfig",
    "ReinforceLoss",
    "VanillaLoss",
    "WorkerResources",
    "RejectionConfig",
    "RolloutCorrectionConfig",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
]
