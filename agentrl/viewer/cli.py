"""`agentrl view RUN_DIR` (the trajectory viewer in the browser) and `agentrl replay RUN_DIR --episode ID`."""

from __future__ import annotations

import argparse
from pathlib import Path

VIEW_HELP = """Serve a web page over a run directory (training run or `agentrl eval` output): steps, groups and
episodes with filters and search, each episode's tokens coloured by response_mask (hover: token id, rollout and
trainer logprob), its tool calls, a group's episodes side by side; a training run's curves (smoothed, with
held-out marks; refreshed while the run is live), an evaluation's report and `--compare` results as tables.
Everything is served from this machine; the page needs no internet access."""

REPLAY_HELP = """Re-run one recorded episode's agent loop on the embedded engine with its recorded sampling seeds
and tool responses (no tool services needed) and report whether the tokens are identical, or the first token
that differs and the step responsible. Exit status 0: identical, 1: diverged."""


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="browse a run's episodes and curves in the browser", description=VIEW_HELP)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run dir or an `agentrl eval` output dir")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8770, help="0: pick a free port")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer dir (default: RUN_DIR/final_model, config.yaml's model, eval.json's model)")
    p.set_defaults(func=_view)

    r = sub.add_parser("replay", help="re-run a recorded episode and check its tokens are identical",
                       description=REPLAY_HELP)
    r.add_argument("run_dir", metavar="RUN_DIR")
    r.add_argument("--episode", required=True, metavar="ID", help="episode_id (as `agentrl view` shows) or row number")
    r.add_argument("--model", default=None, metavar="DIR",
                   help="HF model dir with the weights the episode was sampled with (default: the recorded model; "
                        "for a training step > 1 export that step's checkpoint with `agentrl export`)")
    r.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="engine dtype (default: the run's engine.dtype)")
    r.set_defaults(func=_replay)


def _view(args: argparse.Namespace) -> int:
    from agentrl.errors import UserError
    from agentrl.services import bind_port, serve_asgi
    from agentrl.viewer.server import create_app

    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir} is not a directory: pass a training run dir or an `agentrl eval` output dir")
    app = create_app(args.run_dir, tokenizer_path=args.tokenizer)
    sock = bind_port(args.host, args.port)
    try:
        serve_asgi(app, sock, lambda url: f"viewer ready on {url}/ ({args.run_dir})", log_level="warning",
                   access_log=False)
    finally:
        sock.close()
    return 0


def _replay(args: argparse.Namespace) -> int:
    import asyncio

    from agentrl.agent_loop.replay import ReplayError, find_episode, replay_episode
    from agentrl.inference.local import LocalEngine

    row = find_episode(args.run_dir, args.episode)
    rec = row.get("replay") or {}
    engine_rec = rec.get("engine") or {}
    model = args.model or engine_rec.get("model")
    if not model or not (Path(model) / "config.json").is_file():
        raise ReplayError(f"no model to replay with (recorded: {model!r}): pass --model DIR, the HF model dir "
                          "whose weights sampled the episode")
    if engine_rec.get("weight_version") and not args.model:
        print(f"note: the episode was sampled at weight version {engine_rec['weight_version']}; {model} holds the "
              "initial weights, so tokens will differ unless you pass --model with that step's weights")
    config = run_engine_config(args.run_dir, max_model_len=engine_rec.get("max_model_len"), dtype=args.dtype)

    async def main():
        engine = LocalEngine.from_pretrained(model, config)
        try:
            return await replay_episode(row, engine, engine.tokenizer), engine.tokenizer
        finally:
            await engine.close()

    result, tokenizer = asyncio.run(main())
    print(result.report(tokenizer))
    return 0 if result.identical else 1


def run_engine_config(run_dir: str | Path, *, max_model_len: int | None, dtype: str | None):
    """The run's local engine settings (config.yaml's engine section or eval.json's), for a replay on CPU."""
    import json

    import yaml

    from agentrl.inference.config import EngineConfig

    run_dir = Path(run_dir)
    section: dict = {}
    if (run_dir / "config.yaml").is_file():
        section = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("engine") or {}
    elif (run_dir / "eval.json").is_file():
        section = json.loads((run_dir / "eval.json").read_text()).get("config", {}).get("engine") or {}
    keep = {"dtype", "max_batch_size", "max_prefill_tokens", "prefix_cache_tokens",
            "shared_prefix_cache_tokens", "num_threads"}
    values = {k: v for k, v in section.items() if k in keep}
    values.update(backend="local", device="cpu", max_model_len=max_model_len)
    if dtype:
        values["dtype"] = dtype
    return EngineConfig(**{k: v for k, v in values.items() if k in EngineConfig.model_fields})


__all__ = ["add_commands", "run_engine_config"]
