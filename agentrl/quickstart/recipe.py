"""The quickstart's recipe: `recipes/quickstart/{quickstart,sft,train}.yaml` read into one `QuickstartConfig`.

`quickstart.yaml` holds the quickstart's own settings (the model it builds, the data it generates, the
evaluations); `sft.yaml` is an `SFTConfig` and `train.yaml` a `TrainConfig`, under the keys `sft` and `train`.
Variant folders beside them hold overlays of the same three files (a mapping merges into the recipe's key by
key, any other value replaces it), applied in this order: `with-code/` for every run with the code suite,
`code/` for a run on the code suite alone, `async/` for --async, `smoke/` for --smoke. The run's suites come
from --suites, else --set data.suites, else quickstart.yaml. Then `--set` takes the real dotted keys: `seed=1`,
`data.demos.calc=1000`, `sft.sft.max_steps=300`, `train.actor.lr=2e-4`.

One rule reaches across the phases: `seed` fills `sft.sft.seed`, `train.data.seed`, `train.rollout.seed` and
`train.trainer.seed` where the files leave them out (--set still wins).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from agentrl.config import ConfigError, ConfigModel, load_config
from agentrl.data.suites import SUITES
from agentrl.data.suites.calc import check_op_weights
from agentrl.errors import UserError
from agentrl.trainer.config import TrainConfig
from agentrl.trainer.sft import SFTConfig

# The recipe shipped with the source tree; `agentrl quickstart --recipe DIR` runs a copy of it.
RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes" / "quickstart"
FILES = {"": "quickstart.yaml", "sft": "sft.yaml", "train": "train.yaml"}  # key in QuickstartConfig -> file
SEED_KEYS = ("sft.sft.seed", "train.data.seed", "train.rollout.seed", "train.trainer.seed")
# Keys the driver fills in at run time, and where the user sets them instead.
RUN_TIME_KEYS = {
    "sft.model.path": "the model it builds in --run-dir", "sft.data.train_files": "its demonstrations in --run-dir",
    "sft.sft.run_dir": "--run-dir DIR", "sft.sft.output_dir": "--run-dir DIR",
    "train.model.path": "its SFT model (or sft_model=DIR)", "train.data.train_files": "its GRPO tasks in --run-dir",
    "train.tools": "--tools-port PORT", "train.trainer.run_dir": "--run-dir DIR",
    "train.reward.sandbox_url": "--sandbox-port PORT", "run_dir": "--run-dir DIR", "smoke": "--smoke",
    "tools_port": "--tools-port PORT", "sandbox_port": "--sandbox-port PORT", "with_sandbox": "--no-sandbox",
    "suites": "--suites NAMES or data.suites=[...]",
}


class QuickstartError(UserError):
    """A quickstart option, recipe file or --set value that cannot be used."""


SuiteName = Literal[SUITES]  # type: ignore[valid-type]


class QuickstartModelConfig(ConfigModel):
    size: str = "tiny"  # `agentrl init-model --size`
    init: Literal["random", "copy"] = "copy"  # `agentrl init-model --init`


class QuickstartDataConfig(ConfigModel):
    suites: list[SuiteName] = Field(default_factory=lambda: ["calc", "lookup"], min_length=1)
    demos: dict[SuiteName, int] = Field(default_factory=dict)  # SFT demonstrations per suite; every suite of the run
    calc_op_weights: list[float] | None = None  # shares of 1-, 2-, 3-operation calc demos; None: the split's
    rl_tasks: dict[SuiteName, int] = Field(default_factory=dict)  # GRPO tasks per suite; every suite of the run
    hard_rl_tasks: bool = True  # GRPO tasks from the train split's hard mix
    heldout_per_suite: int = Field(200, ge=1)
    code_test_call: bool = True  # code demos call the python tool before answering
    code_comments: bool = False  # code demos restate each phrase of the task as a comment

    @model_validator(mode="after")
    def _counts_for_every_suite(self) -> "QuickstartDataConfig":
        if len(set(self.suites)) != len(self.suites):
            raise ValueError(f"data.suites={self.suites}: choose distinct names among {', '.join(SUITES)}")
        for key, counts in (("demos", self.demos), ("rl_tasks", self.rl_tasks)):
            for suite, count in counts.items():
                if count < 1:
                    raise ValueError(f"data.{key}.{suite}={count}: give a count of at least 1, e.g. "
                                     f"data.{key}.{suite}=1000")
            missing = [s for s in self.suites if s not in counts]
            if missing:
                raise ValueError(f"data.{key} has no count for {', '.join(missing)}: set e.g. "
                                 f"data.{key}.{missing[0]}=1000")
        if self.calc_op_weights is not None:  # the data generation checks them too; here they fail before any work
            check_op_weights(self.calc_op_weights)
        return self


class QuickstartEvalConfig(ConfigModel):
    sampled_n: int = Field(4, ge=0)  # held-out samples per task at the rollouts' temperature; 0: greedy pass@1 only


class QuickstartConfig(ConfigModel):
    seed: int = 0  # initial weights, data, and every phase seed the files leave out
    model: QuickstartModelConfig = Field(default_factory=QuickstartModelConfig)
    data: QuickstartDataConfig = Field(default_factory=QuickstartDataConfig)
    eval: QuickstartEvalConfig = Field(default_factory=QuickstartEvalConfig)
    sft_model: str | None = None  # an SFT model of an earlier quickstart with the same seed: skip the SFT phase
    pin_kernels: bool = True  # AVX2 kernels for ATen and MKL (agentrl.numerics)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _grpo_can_learn(self) -> "QuickstartConfig":
        if not self.train.rollout.temperature > 0:
            raise ValueError(f"train.rollout.temperature={self.train.rollout.temperature:g}: must be > 0 (at 0 every "
                             "episode of a group is the same, so no group carries a GRPO signal); e.g. 0.7")
        agent = self.train.agent
        if agent.max_new_tokens_per_turn > agent.max_response_tokens:
            raise ValueError(f"train.agent.max_new_tokens_per_turn ({agent.max_new_tokens_per_turn}) is more than the "
                             f"whole response (train.agent.max_response_tokens={agent.max_response_tokens}): set it "
                             f"to at most {agent.max_response_tokens}")
        return self


def needs_sandbox(suites: list[str]) -> bool:
    """Whether a suite runs code (the code suite: its python tool and its unit-test rewards)."""
    return "code" in suites


def merge(base: dict, overlay: dict) -> dict:
    """`overlay` over `base`: mappings merge key by key, any other value replaces."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_folder(folder: Path) -> dict:
    """The three files of a recipe or variant folder as one tree (a missing file is an empty mapping)."""
    tree: dict[str, Any] = {}
    for key, name in FILES.items():
        path = folder / name
        if not path.is_file():
            continue
        try:
            part = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise QuickstartError(f"{path} is not valid YAML: {e}") from None
        if not isinstance(part, dict):
            raise QuickstartError(f"{path}: the top level must be a mapping of config keys")
        tree = merge(tree, {key: part} if key else part)
    return tree


def variant_folders(recipe: Path, suites: list[str], smoke: bool, asynchronous: bool = False) -> list[Path]:
    """The overlays a run on `suites` applies, in order: `with-code/` when the code suite is among them, the
    folder of its one suite if the recipe has one (`code/`), then `async/` for --async and `smoke/` for --smoke."""
    folders = [recipe / "with-code"] if needs_sandbox(suites) else []
    folders += [recipe / suites[0]] if len(suites) == 1 and (recipe / suites[0]).is_dir() else []
    folders = [f for f in folders if f.is_dir()]
    for flag, name in ((asynchronous, "async"), (smoke, "smoke")):
        if flag and not (recipe / name).is_dir():
            raise QuickstartError(f"quickstart --{name}: the recipe {recipe} has no {name}/ folder; copy it from "
                                  "recipes/quickstart of the agentrl source tree")
        folders += [recipe / name] if flag else []
    return folders


def check_set_keys(sets: list[str]) -> None:
    """--set KEY=VALUE items whose key the driver fills in are refused, naming the option that sets it."""
    for item in sets:
        key = item.partition("=")[0]
        owner = next((k for k in RUN_TIME_KEYS if key == k or key.startswith(k + ".")), None)
        if owner is not None:
            raise QuickstartError(f"quickstart --set {key}: set by the quickstart from {RUN_TIME_KEYS[owner]}")


def load_recipe(recipe: Path = RECIPE_DIR, *, suites: list[str] | None = None, smoke: bool = False,
                asynchronous: bool = False, sets: list[str] | tuple[str, ...] = ()) -> QuickstartConfig:
    """The recipe in `recipe` with the overlays of the run's suites (`suites`, else --set data.suites, else the
    recipe's), of `asynchronous` (--async) and of `smoke`, then `sets` (dotted KEY=VALUE items)."""
    if not (recipe / FILES[""]).is_file():
        raise QuickstartError(f"quickstart recipe: {recipe / FILES['']} does not exist; pass --recipe DIR with a "
                              "copy of recipes/quickstart from the agentrl source tree")
    sets = list(sets)
    check_set_keys(sets)
    given = [item for item in sets if item.partition("=")[0] == "data.suites"]
    if suites and given:
        raise QuickstartError("quickstart: give the suites once, with --suites or with --set data.suites=[...]")
    overrides = [f"data.suites=[{', '.join(suites)}]"] if suites else []
    source = str(recipe)
    try:
        tree = read_folder(recipe)
        given_suites = load_config(QuickstartConfig, data=tree, overrides=overrides + given, source=source)
        run_suites = given_suites.data.suites
        folders = variant_folders(recipe, run_suites, smoke, asynchronous)
        source = " + ".join([str(recipe), *(f.name for f in folders)])
        for folder in folders:
            tree = merge(tree, read_folder(folder))
        overrides += sets
        seed = load_config(QuickstartConfig, data=tree, overrides=overrides, source=source).seed
        for key in SEED_KEYS:
            *parents, leaf = key.split(".")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node.setdefault(leaf, seed)
        return load_config(QuickstartConfig, data=tree, overrides=overrides, source=source)
    except ConfigError as e:
        raise QuickstartError(f"quickstart: {e}") from None
