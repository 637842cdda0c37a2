"""Test helpers: free loopback ports and real service processes that always shut down."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from agentrl.services import free_port, run_service  # noqa: F401  (re-exported for tests)

REPO_ROOT = Path(__file__).resolve().parents[1]
QWEN2_TOKENIZER_DIR = REPO_ROOT / "agentrl" / "models" / "qwen2_tokenizer"  # package data: `agentrl bench step` uses it


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll `url` until it answers 2xx; fail early if `proc` died."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"service exited with code {proc.returncode} before {url} answered:\n{out[-4000:]}")
        try:
            r = httpx.get(url, timeout=2.0)
            if r.status_code < 300:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s (last: {last})")


@contextlib.contextmanager
def service(args: list[str], health_url: str, timeout: float = 60.0,
            env: dict | None = None) -> Iterator[subprocess.Popen]:
    """Run `python -m ...`-style `args` as a subprocess in its own process group; kill the group on exit."""
    cmd = args if args[0] != "python" else [sys.executable, *args[1:]]
    with run_service(cmd, health_url, name=" ".join(args[:4]), env=env, cwd=REPO_ROOT, timeout_s=timeout) as proc:
        yield proc


@contextlib.contextmanager
def sandbox_service(*settings: str) -> Iterator[str]:
    """A sandbox service (bwrap backend) on a free loopback port for one test module; yields its URL. Skips
    the test where bubblewrap is missing."""
    import shutil

    import pytest

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make bwrap)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["python", "-m", "sandbox", "serve", "--port", str(port)]
    for item in settings:
        args += ["--set", item]
    with service(args, f"{url}/v1/ping"):
        yield url


def forcing_weights(model, avoid: set[int]) -> tuple[dict, int]:
    """New weights for a tiny Qwen2 `model` under which greedy decoding emits one known id F after any context,
    and F (never an id of `avoid`, e.g. the old model's greedy output).

    The last layer's attention gets zero value weights and a value bias, so it adds the same vector (1000 * u) to
    every position's residual; after the final norm the logits are ~ E (w * u) for the (tied) embedding E and norm
    weight w, whose argmax F does not depend on the context.
    """
    import torch

    sd = {k: v.clone() for k, v in model.state_dict().items()}
    last = f"model.layers.{model.config.num_hidden_layers - 1}.self_attn"
    emb, norm = sd["model.embed_tokens.weight"], sd["model.norm.weight"]
    gen = torch.Generator().manual_seed(1)
    while True:
        u = torch.randn(emb.shape[1], generator=gen)
        forced = int((emb @ (norm * u)).argmax())
        if forced not in avoid:
            break
    sd[f"{last}.v_proj.weight"].zero_()
    sd[f"{last}.v_proj.bias"].zero_()
    sd[f"{last}.v_proj.bias"][0] = 1.0
    sd[f"{last}.o_proj.weight"].zero_()
    sd[f"{last}.o_proj.weight"][:, 0] = 1000.0 * u
    return sd, forced


def guessing_weights(model, tokenizer, *, p_end: float = 0.3, p_digits: float = 0.6) -> dict:
    """New weights for a tiny Qwen2 `model` (tied embeddings) that samples every token from one fixed
    distribution, whatever the context: <|im_end|> with probability ~p_end, a digit 0-9 with ~p_digits in all,
    any other token the rest. A turn is then a short random number ("37"), so a guessing game gets guesses, some
    right, and its episodes differ in reward. Same construction as `forcing_weights`: the last attention layer
    adds 1000 * u to every position, so after the final norm h = norm_weight * u / rms(u) for every context."""
    import math

    import torch

    sd = {k: v.clone() for k, v in model.state_dict().items()}
    last = f"model.layers.{model.config.num_hidden_layers - 1}.self_attn"
    emb, norm = sd["model.embed_tokens.weight"], sd["model.norm.weight"]
    u = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(2))
    h = norm * u / u.pow(2).mean().sqrt()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    rest = torch.ones(emb.shape[0], dtype=torch.bool)
    rest[[end, *digits]] = False
    z_rest = float((emb[rest] @ h).exp().sum())  # the other tokens' share stays as the random weights give it
    p_rest = 1.0 - p_end - p_digits
    emb[end] = math.log(p_end / p_rest * z_rest) * h / h.dot(h)
    for d in digits:
        emb[d] = math.log(p_digits / 10 / p_rest * z_rest) * h / h.dot(h)
    sd[f"{last}.v_proj.weight"].zero_()
    sd[f"{last}.v_proj.bias"].zero_()
    sd[f"{last}.v_proj.bias"][0] = 1.0
    sd[f"{last}.o_proj.weight"].zero_()
    sd[f"{last}.o_proj.weight"][:, 0] = 1000.0 * u
    if "lm_head.weight" in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


@contextlib.contextmanager
def two_node_ray(resource: str) -> Iterator:
    """A simulated two-node Ray cluster on this host (`ray.cluster_utils.Cluster`), each node with 1 CPU and one
    unit of the custom `resource`, connected for the test and shut down after it. Skips when the session's own
    Ray is up (the cluster needs a Ray of its own)."""
    import pytest
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.skip("a Ray of this test session is up; the simulated cluster needs its own")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {resource: 1}})
    try:
        cluster.add_node(num_cpus=1, resources={resource: 1})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def peft_lora_model(model_dir, seed: int, target_modules=("q_proj", "v_proj", "o_proj", "down_proj"), **config):
    """The HF model in `model_dir` (float32) under a peft LoRA adapter (rank 4, alpha 8 unless `config` says
    otherwise) whose lora_B is random and non-zero (peft starts it at zero, which changes nothing), in eval mode.
    `save_pretrained(dir)` writes it as a trainer would."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    settings = {"r": 4, "lora_alpha": 8, "target_modules": list(target_modules), **config}
    model = peft.get_peft_model(base, peft.LoraConfig(**settings))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.4)
    return model.eval()
