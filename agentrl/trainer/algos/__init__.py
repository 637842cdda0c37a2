"""RL math: advantage estimators, policy and value losses, reference-KL estimators and controllers, rollout
correction, loss aggregation, and log-probabilities / entropy from logits.

Pure functions over torch tensors: no models, no config objects. Formulas follow verl's `core_algos.py` and
"Policy 与 Value Update" (the verl walkthrough); deliberate differences are stated where they occur.
Shape suffixes: B trajectories, T response tokens (padded), V vocabulary. Masks are 0/1 tensors (bool, int or
float) shaped like the tensor they select from; 1 marks a token sampled by the policy.

Modules: `core` (reductions, GRPO, KL estimators, agg_loss, logprobs), `advantages` (estimators and their
registry), `loss_records` (PolicyLossInputs, PolicyLossKnobs, LossOutputs), `losses` (value loss, the policy
losses and their registry), `objective` (the actor's total loss), `kl_control` (reward-side KL and its
coefficient), `rollout_correction` (importance weights, rejection).
Import from `agentrl.trainer.algos`.
"""

from agentrl.trainer.algos.advantages import *  # noqa: F403
from agentrl.trainer.algos.advantages import __all__ as _advantages_all
from agentrl.trainer.algos.core import (
    AGG_MODES,
    DEFAULT_CHUNK_ELEMENTS,
    KL_KINDS,
    LOG_RATIO_CLAMP,
    LOW_VAR_KL_CLAMP,
    KLKind,
    LossAggMode,
    agg_loss,
    broadcast_advantages,
    entropy_from_logits,
    grpo_advantages,
    kl_penalty,
    logprobs_and_entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from agentrl.trainer.algos.kl_control import *  # noqa: F403
from agentrl.trainer.algos.kl_control import __all__ as _kl_control_all
from agentrl.trainer.algos.loss_records import *  # noqa: F403
from agentrl.trainer.algos.loss_records import __all__ as _loss_records_all
from agentrl.trainer.algos.losses import *  # noqa: F403
from agentrl.trainer.algos.losses import __all__ as _losses_all
from agentrl.trainer.algos.objective import *  # noqa: F403
from agentrl.trainer.algos.objective import __all__ as _objective_all
from agentrl.trainer.algos.rollout_correction import *  # noqa: F403
from agentrl.trainer.algos.rollout_correction import __all__ as _rollout_correction_all

__all__ = [
    "AGG_MODES",
    "DEFAULT_CHUNK_ELEMENTS",
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "KLKind",
    "LossAggMode",
    "LOW_VAR_KL_CLAMP",
    "agg_loss",
    "broadcast_advantages",
    "entropy_from_logits",
    "grpo_advantages",
    "kl_penalty",
    "logprobs_and_entropy_from_logits",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    *_advantages_all,
    *_kl_control_all,
    *_loss_records_all,
    *_losses_all,
    *_objective_all,
    *_rollout_correction_all,
]
