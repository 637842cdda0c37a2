"""The config machinery: nested pydantic models from YAML + dotted overrides, with actionable errors."""

from __future__ import annotations

from typing import Literal

import pytest
import yaml
from pydantic import Field, model_validator

from agentrl.config import ConfigError, ConfigModel, import_object, load_config, parse_override, save_config


class OptimCfg(ConfigModel):
    lr: float = 1e-6
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    schedule: Literal["constant", "cosine"] = "constant"

    @model_validator(mode="after")
    def _check(self) -> OptimCfg:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        return self


class RootCfg(ConfigModel):
    name: str = "run"
    steps: int = Field(10, ge=1)
    use_kl: bool = False
    files: list[str] = Field(default_factory=list)
    seed: int | None = None
    actor: OptimCfg = Field(default_factory=OptimCfg)


def write(tmp_path, data) -> str:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_yaml_and_overrides_build_nested_models(tmp_path):
    path = write(tmp_path, {"name": "x", "actor": {"lr": 0.001}, "files": ["a.jsonl"]})
    cfg = load_config(RootCfg, path, ["actor.clip_ratio_high=0.28", "steps=3", "actor.lr=1e-5", "seed=null"])
    assert cfg.name == "x" and cfg.steps == 3 and cfg.seed is None
    assert cfg.actor.lr == pytest.approx(1e-5)
    assert cfg.actor.clip_ratio_high == pytest.approx(0.28)
    assert cfg.files == ["a.jsonl"]
    assert isinstance(cfg.actor, OptimCfg)


def test_int_is_accepted_for_float_but_not_the_reverse(tmp_path):
    cfg = load_config(RootCfg, overrides=["actor.lr=1"])
    assert cfg.actor.lr == 1.0 and isinstance(cfg.actor.lr, float)
    with pytest.raises(ConfigError, match=r"steps: expected int, got float"):
        load_config(RootCfg, overrides=["steps=1.5"])


def test_misspelled_key_names_key_file_and_nearest_valid_key(tmp_path):
    path = write(tmp_path, {"actor": {"clip_ratio_lo": 0.1}})
    with pytest.raises(ConfigError) as e:
        load_config(RootCfg, path)
    msg = str(e.value)
    assert "actor.clip_ratio_lo" in msg and path in msg and "did you mean 'actor.clip_ratio_low'" in msg


def test_misspelled_override_is_reported_too():
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        load_config(RootCfg, overrides=["step=3"])


def test_wrong_type_names_key_and_expected_type(tmp_path):
    path = write(tmp_path, {"actor": {"lr": "fast"}})
    with pytest.raises(ConfigError, match=r"actor.lr: expected float, got str 'fast'"):
        load_config(RootCfg, path)
    with pytest.raises(ConfigError, match=r"use_kl: expected bool"):
        load_config(RootCfg, overrides=["use_kl=3"])
    with pytest.raises(ConfigError, match=r"files\[1\]: expected str"):
        load_config(RootCfg, overrides=["files=[a, 3]"])


def test_literal_bound_and_validator_messages():
    with pytest.raises(ConfigError, match="did you mean 'cosine'"):
        load_config(RootCfg, overrides=["actor.schedule=cosin"])
    with pytest.raises(ConfigError, match="lr must be > 0"):
        load_config(RootCfg, overrides=["actor.lr=-1"])
    with pytest.raises(ConfigError, match=r"^steps must be >= 1, got 0 \(<defaults> \+ overrides steps=0\)$"):
        load_config(RootCfg, overrides=["steps=0"])
    with pytest.raises(ConfigError, match=r"^actor: expected a mapping for OptimCfg, got int 3"):
        load_config(RootCfg, overrides=["actor=3"])


def test_models_built_in_python_raise_the_same_one_line_errors():
    with pytest.raises(ConfigError, match=r"^steps must be >= 1, got 0$"):
        RootCfg(steps=0)
    with pytest.raises(ConfigError, match=r"^actor.lr: expected float, got str 'x'$"):
        RootCfg(actor={"lr": "x"})


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(RootCfg, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(RootCfg, bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(RootCfg, bad)


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("actor.lr")
    assert parse_override("a.b=1e-6") == (["a", "b"], 1e-6)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override("a=hello") == (["a"], "hello")


def test_resolved_config_round_trips_through_the_run_dir(tmp_path):
    cfg = load_config(RootCfg, overrides=["actor.lr=0.5"])
    out = save_config(cfg, tmp_path / "run")
    again = load_config(RootCfg, out)
    assert again == cfg


def test_import_object_escape_hatch():
    assert import_object("json:dumps", "reward.fn")({"a": 1}) == '{"a": 1}'
    with pytest.raises(ConfigError, match="reward.fn: module 'json' has no attribute 'nope'"):
        import_object("json:nope", "reward.fn")
    with pytest.raises(ConfigError, match="must look like 'package.module:function'"):
        import_object("json.dumps", "reward.fn")
