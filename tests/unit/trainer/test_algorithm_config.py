"""algorithm / actor.policy_loss / critic configuration: defaults, resolution and load-time errors."""

from __future__ import annotations

import logging

import pytest

from agentrl.config import ConfigError, load_config, save_config, to_dict
from agentrl.trainer.config import TrainConfig


def load(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, overrides=list(overrides))


def test_defaults_are_grpo_without_critic():
    cfg = load()
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.critic.enable is False
    assert cfg.actor.policy_loss.loss_mode == "vanilla"
    assert cfg.algorithm.kl_ctrl.type == "fixed" and cfg.algorithm.rollout_correction.level is None


def test_gae_turns_the_critic_on_and_inherits_actor_batching():
    cfg = load("algorithm.adv_estimator=gae", "algorithm.lam=0.95", "actor.ppo_epochs=2",
               "actor.loss_agg_mode=seq-mean-token-mean", "data.train_batch_size=16", "critic.ppo_mini_batch_size=4")
    assert cfg.critic.enable is True and cfg.critic.ppo_epochs == 2
    assert cfg.critic.loss_agg_mode == "seq-mean-token-mean" and cfg.critic.ppo_mini_batch_size == 4
    assert cfg.critic.model.path is None  # initialise from the policy


def test_resolved_config_round_trips(tmp_path):
    cfg = load("algorithm.adv_estimator=gae", "algorithm.kl_ctrl.type=adaptive", "actor.policy_loss.loss_mode=cispo")
    assert load_config(TrainConfig, save_config(cfg, tmp_path)) == cfg


def test_gae_without_critic_is_rejected_naming_the_keys():
    with pytest.raises(ConfigError, match=r"adv_estimator='gae' needs critic values.*critic.enable=true"):
        load("algorithm.adv_estimator=gae", "critic.enable=false")


def test_critic_with_grpo_is_only_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="agentrl.trainer.config"):
        cfg = load("critic.enable=true")
    assert cfg.critic.enable is True and "trained and unused" in caplog.text


def test_both_kl_paths_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="agentrl.trainer.config"):
        load("algorithm.use_kl_in_reward=true", "actor.use_kl_loss=true")
    assert "applied twice" in caplog.text


def test_unknown_names_fail_at_load_time():
    with pytest.raises(ConfigError, match=r"loss_mode 'gpso' is unknown; choose one of vanilla, gspo"):
        load("actor.policy_loss.loss_mode=gpso")
    with pytest.raises(ConfigError, match=r"adv_estimator 'ppo' is unknown; choose one of gae, grpo, rloo"):
        load("algorithm.adv_estimator=ppo")
    with pytest.raises(ConfigError, match="cannot import module"):
        load("algorithm.adv_estimator=no_such_pkg.mod:fn")
    with pytest.raises(ConfigError, match="algorithm.kl_penalty: 'k4' is not one of 'kl', 'k1'"):
        load("algorithm.kl_penalty=k4")
    with pytest.raises(ConfigError, match="did you mean 'adaptive'"):
        load("algorithm.kl_ctrl.type=adaptiv")


USER_MODULE = """
def estimator(inputs):
    return inputs.mask_B_T * 1.0, None

def two_args(a, b):
    return a, b

def my_loss(inputs, options):
    return inputs.agg(-inputs.advantages_B_T * inputs.logprobs_B_T), {"seen_ratio": options.clip_cov_ratio}
"""


def test_module_function_escape_hatches_are_signature_checked(tmp_path, monkeypatch):
    (tmp_path / "my_algos.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load("algorithm.adv_estimator=my_algos:estimator", "actor.policy_loss.loss_mode=my_algos:my_loss")
    assert cfg.algorithm.adv_estimator == "my_algos:estimator"
    with pytest.raises(ConfigError, match="must accept one argument"):
        load("algorithm.adv_estimator=my_algos:two_args")
    with pytest.raises(ConfigError, match=r"json:dumps\) must accept \(inputs: PolicyLossInputs, options: "
                                          r"PolicyLossKnobs\) and return LossOutputs"):
        load("actor.policy_loss.loss_mode=json:dumps")


def test_policy_loss_knobs_carry_the_configured_values():
    cfg = load("actor.clip_ratio_low=0.1", "actor.clip_ratio_high=0.28", "actor.clip_ratio_c=4.0",
               "actor.policy_loss.loss_mode=clip_cov", "actor.policy_loss.clip_cov_ratio=0.01",
               "actor.policy_loss.clip_cov_lb=0.5", "actor.policy_loss.clip_cov_ub=6.0")
    knobs = cfg.actor.policy_loss_knobs()
    assert (knobs.clip_ratio_low, knobs.clip_ratio_high, knobs.clip_ratio_c) == (0.1, 0.28, 4.0)
    assert (knobs.clip_cov_ratio, knobs.clip_cov_lb, knobs.clip_cov_ub) == (0.01, 0.5, 6.0)
    knobs = load("actor.policy_loss.loss_mode=kl_cov", "actor.policy_loss.kl_cov_ratio=0.02",
                 "actor.policy_loss.ppo_kl_coef=0.3").actor.policy_loss_knobs()
    assert (knobs.kl_cov_ratio, knobs.ppo_kl_coef) == (0.02, 0.3)


def test_a_knob_of_another_loss_mode_names_the_mode_it_belongs_to():
    with pytest.raises(ConfigError, match=r"^actor.policy_loss.kl_cov_ratio belongs to loss_mode 'kl_cov', not "
                                          r"'vanilla': set actor.policy_loss.loss_mode=kl_cov or drop the key"):
        load("actor.policy_loss.kl_cov_ratio=0.02")
    with pytest.raises(ConfigError, match=r"clip_cov_lb belongs to loss_mode 'clip_cov', not 'gspo'"):
        load("actor.policy_loss.loss_mode=gspo", "actor.policy_loss.clip_cov_lb=0.5")
    with pytest.raises(ConfigError, match=r"unknown config key 'actor.policy_loss.kl_cov_rati'.*did you mean"):
        load("actor.policy_loss.loss_mode=kl_cov", "actor.policy_loss.kl_cov_rati=0.1")
    with pytest.raises(ConfigError, match=r"actor.policy_loss.kl_cov_ratio must be <= 1.0, got 2"):
        load("actor.policy_loss.loss_mode=kl_cov", "actor.policy_loss.kl_cov_ratio=2")


def test_an_estimator_knob_the_estimator_does_not_read_is_an_error():
    with pytest.raises(ConfigError, match=r"^algorithm.lam is read by adv_estimator 'gae', not 'grpo'"):
        load("algorithm.lam=0.95")
    with pytest.raises(ConfigError, match=r"algorithm.gamma is read by adv_estimator 'gae' or 'reinforce_plus_plus', "
                                          r"not 'rloo'"):
        load("algorithm.adv_estimator=rloo", "algorithm.gamma=0.9")
    with pytest.raises(ConfigError, match=r"norm_adv_by_std_in_grpo is read by adv_estimator 'grpo', not 'gae'"):
        load("algorithm.adv_estimator=gae", "algorithm.norm_adv_by_std_in_grpo=false")
    cfg = load("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.9")
    assert cfg.algorithm.gamma == 0.9 and cfg.algorithm.lam == 1.0  # lam keeps its default, unread
    assert to_dict(cfg)["algorithm"]["gamma"] == 0.9 and "lam" not in to_dict(cfg)["algorithm"]


@pytest.mark.parametrize("overrides", [
    (), ("actor.policy_loss.loss_mode=gspo",), ("actor.policy_loss.loss_mode=cispo",),
    ("actor.policy_loss.loss_mode=clip_cov", "actor.policy_loss.clip_cov_ub=4.0"),
    ("actor.policy_loss.loss_mode=kl_cov", "actor.policy_loss.ppo_kl_coef=0.2"),
    ("actor.policy_loss.loss_mode=reinforce", "algorithm.adv_estimator=rloo"),
    ("algorithm.adv_estimator=gae", "algorithm.lam=0.95", "algorithm.gamma=0.99"),
    ("algorithm.adv_estimator=reinforce_plus_plus_baseline",),
], ids=lambda o: " ".join(o) or "defaults")
def test_every_mode_dumps_only_its_knobs_and_loads_back(tmp_path, overrides):
    cfg = load(*overrides)
    dumped = to_dict(cfg)
    assert set(dumped["actor"]["policy_loss"]) == set(type(cfg.actor.policy_loss).model_fields)
    assert load_config(TrainConfig, save_config(cfg, tmp_path)) == cfg


def test_a_config_saved_with_every_knob_at_its_default_still_loads():
    """Run directories written before the loss modes and estimators were keyed on their name list every knob."""
    saved = to_dict(load())
    saved["actor"]["policy_loss"] = {"loss_mode": "gspo", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0,
                                     "clip_cov_ub": 5.0, "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1}
    saved["algorithm"].update(gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True)
    cfg = load_config(TrainConfig, data=saved)
    assert cfg == load("actor.policy_loss.loss_mode=gspo")
    saved["algorithm"]["lam"] = 0.9  # a value other than the default was a real setting: it is not dropped silently
    with pytest.raises(ConfigError, match="algorithm.lam is read by adv_estimator 'gae'"):
        load_config(TrainConfig, data=saved)


def test_bypass_mode_with_is_weights_needs_the_reinforce_loss():
    with pytest.raises(ConfigError, match=r"bypass_mode=true.*loss_mode='vanilla'.*loss_mode=reinforce"):
        load("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.level=token")
    cfg = load("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.level=sequence",
               "actor.policy_loss.loss_mode=reinforce")
    assert cfg.algorithm.rollout_correction.is_threshold == 2.0
    assert load("algorithm.rollout_correction.bypass_mode=true").algorithm.rollout_correction.bypass_mode


def test_rollout_correction_band_and_rejection_validation():
    corr = load("algorithm.rollout_correction.level=token", "algorithm.rollout_correction.mode=mask",
                "algorithm.rollout_correction.threshold=4").algorithm.rollout_correction
    assert corr.is_threshold == (0.25, 4.0)
    with pytest.raises(ConfigError, match="needs 0 < lower < upper"):
        load("algorithm.rollout_correction.rejection.level=token", "algorithm.rollout_correction.rejection.upper=2")
    with pytest.raises(ConfigError, match="lower < upper"):
        load("algorithm.rollout_correction.lower=3", "algorithm.rollout_correction.upper=2")


@pytest.mark.parametrize("override,message", [
    ("actor.clip_ratio_c=1.0", r"actor.clip_ratio_c must be > 1.0, got 1.0"),
    ("actor.clip_ratio_low=1", r"actor.clip_ratio_low must be < 1.0, got 1"),
    ("actor.clip_ratio_high=-0.1", r"actor.clip_ratio_high must be >= 0.0, got -0.1"),
    ("critic.cliprange_value=-1", r"critic.cliprange_value must be >= 0.0, got -1"),
    ("algorithm.kl_ctrl.kl_coef=-0.1", r"algorithm.kl_ctrl.kl_coef must be >= 0.0, got -0.1"),
    ("actor.kl_loss_type=k4", r"actor.kl_loss_type: 'k4' is not one of 'kl'"),
])
def test_the_loss_knobs_are_checked_where_they_are_configured(override, message):
    """The losses and the KL controller take these values as given: the config is the one place that checks."""
    with pytest.raises(ConfigError, match=message):
        load(override)


def test_adaptive_kl_needs_target_and_horizon():
    with pytest.raises(ConfigError, match="target_kl > 0 and horizon >= 1"):
        load("algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0")


def test_gspo_with_ppo_sized_clip_ranges_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="agentrl.trainer.config"):
        load("actor.policy_loss.loss_mode=gspo")
    assert "clip_ratio_low=3e-4" in caplog.text


def test_async_mode_needs_an_off_policy_correction():
    assert load().trainer.mode == "sync" and load().trainer.max_staleness == 1
    assert load().rollout.on_weight_update == "continue"
    with pytest.raises(ConfigError, match=r"trainer.mode=async .*rollout_correction.level=token\|sequence.*"
                                          r"rejection.level=.*bypass_mode=true") as err:
        load("trainer.mode=async")
    assert "\n" not in str(err.value).strip()  # one line
    for correction in (["algorithm.rollout_correction.level=token"],
                       ["algorithm.rollout_correction.level=sequence", "algorithm.rollout_correction.mode=mask"],
                       ["algorithm.rollout_correction.rejection.level=geometric",
                        "algorithm.rollout_correction.rejection.lower=0.5",
                        "algorithm.rollout_correction.rejection.upper=2"],
                       ["algorithm.rollout_correction.bypass_mode=true"]):
        cfg = load("trainer.mode=async", "trainer.max_staleness=0", "rollout.on_weight_update=abort", *correction)
        assert cfg.trainer.mode == "async" and cfg.trainer.max_staleness == 0
    with pytest.raises(ConfigError, match="max_staleness"):
        load("trainer.max_staleness=-1")
    with pytest.raises(ConfigError, match="on_weight_update"):
        load("rollout.on_weight_update=wait")
