"""`agentrl engine ...`: serve a LocalEngine over SGLang's HTTP API, or launch real SGLang servers (GPU)."""

from __future__ import annotations

import argparse

from agentrl.auth import TOKEN_ENV, TOKEN_HELP


def add_commands(subparsers) -> None:
    engine = subparsers.add_parser("engine", help="rollout engines: serve the CPU engine, launch SGLang servers")
    sub = engine.add_subparsers(dest="engine_command", metavar="ENGINE_COMMAND", required=True)

    serve = sub.add_parser("serve", help="serve a LocalEngine behind SGLang's native HTTP API (/generate, ...) and "
                                          "the OpenAI chat API (/v1/chat/completions, recorded per episode)")
    serve.add_argument("--model", required=True, help="Hugging Face model directory")
    serve.add_argument("--port", type=int, required=True, help="port to listen on (0: pick a free one)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="bind address (default 127.0.0.1); any other needs a token and --weights-dir")
    serve.add_argument("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
    serve.add_argument("--weights-dir", default=None, metavar="DIR",
                       help="load new weights (/update_weights_from_disk) only from under DIR, e.g. RUN_DIR/weights; "
                            "default: any path on loopback, required with another --host")
    serve.add_argument("--max-batch-size", type=int, default=32, help="decode slots (bounds KV-cache memory)")
    serve.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    serve.add_argument("--max-queued-requests", type=int, default=4096)
    serve.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    serve.add_argument("--device", default="cpu")
    serve.add_argument("--num-threads", type=int, default=None, help="torch threads for the decode thread")
    serve.add_argument("--log-level", default="warning")
    lora = serve.add_argument_group("LoRA adapters (SGLang's /load_lora_adapter; docs/engines.md)")
    lora.add_argument("--enable-lora", action="store_true",
                      help="accept /load_lora_adapter and /generate requests naming an adapter (lora_path)")
    lora.add_argument("--max-loaded-loras", type=int, default=2, metavar="N",
                      help="adapters held at once, each a merged copy of the model's weights (default 2); past it "
                           "the least recently used is unloaded")
    lora.add_argument("--max-lora-rank", type=int, default=None, metavar="R", help="refuse adapters of a higher rank")
    lora.add_argument("--lora-target-modules", nargs="+", default=None, metavar="MODULE",
                      help="refuse adapters on other modules (e.g. q_proj v_proj; all: any)")
    serve.set_defaults(func=_serve)

    launch = sub.add_parser("launch-sglang", help="start SGLang servers (GPU) with the flags RL needs, wait for "
                                                  "/health, print their URLs, run until Ctrl-C")
    launch.add_argument("--model", required=True, help="model path or Hugging Face id")
    launch.add_argument("--num-servers", type=int, default=1)
    launch.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per server")
    launch.add_argument("--base-port", type=int, default=30000)
    launch.add_argument("--host", default="127.0.0.1",
                        help="bind address (default 127.0.0.1); any other needs a token (--token-file)")
    launch.add_argument("--token-file", default=None, metavar="PATH",
                        help=f"file holding the servers' API key (SGLang's --api-key, passed in a private --config "
                             f"file, not on the command line); clients send it as 'Authorization: Bearer <key>' "
                             f"(engine.token_file). Default: ${TOKEN_ENV} if set; required with a --host other than "
                             f"loopback")
    launch.add_argument("--gpus", default=None, help="comma-separated GPU ids to use (default: 0..K*TP-1)")
    launch.add_argument("--mem-fraction-static", type=float, default=0.7)
    launch.add_argument("--context-length", type=int, default=None)
    launch.add_argument("--dtype", default=None)
    launch.add_argument("--no-memory-saver", action="store_true",
                        help="omit --enable-memory-saver (release/resume_memory_occupation then fail)")
    launch.add_argument("--deterministic", action="store_true", help="--enable-deterministic-inference")
    launch.add_argument("--lora-rank", type=int, default=None, metavar="R",
                        help="serve LoRA adapters of up to rank R loaded per step (engine.lora_sync: adapter): adds "
                             "--enable-lora --max-lora-rank R --lora-target-modules ... --max-loras-per-batch N "
                             "--max-loaded-loras N")
    launch.add_argument("--lora-target-modules", nargs="+", default=None, metavar="MODULE",
                        help="with --lora-rank: the adapted modules, as actor.lora.target_modules (e.g. q_proj v_proj; "
                             "all-linear)")
    launch.add_argument("--max-loras-per-batch", type=int, default=2, metavar="N",
                        help="with --lora-rank: adapters per batch and loaded at once (default 2: this step's and "
                             "the one before)")
    launch.add_argument("--health-timeout", type=float, default=900.0)
    launch.add_argument("--urls-file", default=None, help="write the server URLs here, one per line")
    launch.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    launch.add_argument("extra", nargs=argparse.REMAINDER, help="after --: extra sglang.launch_server flags")
    launch.set_defaults(func=_launch_sglang)


def _serve(args) -> int:
    from agentrl.auth import service_token

    token = service_token(args.host, args.token_file, "agentrl engine serve")  # refused before torch is imported
    from agentrl.agent_loop.openai_front import PolicyFront
    from agentrl.agent_loop.openai_server import add_routes
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.local import LocalEngine
    from agentrl.inference.server import check_weights_dir, create_app
    from agentrl.services import bind_port, serve_asgi

    lora = _lora_options(args)
    weights_dir = check_weights_dir(args.weights_dir, args.host)
    config = EngineConfig(device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size,
                          max_model_len=args.max_model_len, max_queued_requests=args.max_queued_requests,
                          num_threads=args.num_threads)
    with bind_port(args.host, args.port) as sock:  # a taken port fails before the model loads
        engine = LocalEngine.from_pretrained(args.model, config)
        app = create_app(engine, str(args.model), token=token, weights_dir=weights_dir, lora=lora)
        # the OpenAI API beside SGLang's: /v1/models, /v1/chat/completions, recorded per episode (docs/agents.md)
        add_routes(app, PolicyFront(engine, engine.tokenizer, model_name=str(args.model),
                                    max_new_tokens=engine.max_model_len, max_model_len=engine.max_model_len))
        try:
            serve_asgi(app, sock,
                       lambda url: f"engine ready on {url} (model {args.model}, max_batch_size="
                                   f"{config.max_batch_size}, max_model_len={engine.max_model_len})",
                       log_level=args.log_level)
        finally:
            if app.state.server.lora is not None:
                app.state.server.lora.close_sync()
            engine.close_sync()
    return 0


def _lora_options(args):
    """`--enable-lora` and its limits, or None; the limits without --enable-lora are a mistake, as in SGLang."""
    from agentrl.inference.server import LoraArgsError, LoraOptions

    given = [flag for flag, value in (("--max-lora-rank", args.max_lora_rank),
                                      ("--lora-target-modules", args.lora_target_modules)) if value is not None]
    if not args.enable_lora:
        if given:
            raise LoraArgsError(f"{' and '.join(given)} set LoRA limits but LoRA is off: add --enable-lora")
        return None
    if args.max_loaded_loras < 1 or (args.max_lora_rank is not None and args.max_lora_rank < 1):
        raise LoraArgsError("--max-loaded-loras and --max-lora-rank must be >= 1")
    return LoraOptions(max_loaded=args.max_loaded_loras, max_rank=args.max_lora_rank,
                       target_modules=tuple(args.lora_target_modules or ()))


def _launch_sglang(args) -> int:
    from dataclasses import replace

    from agentrl.auth import service_token
    from agentrl.inference.launcher import (
        API_KEY_CONFIG,
        SGLangLaunchSpec,
        check_extra_args,
        launch_sglang_servers,
        sglang_server_commands,
    )
    from agentrl.services import sigterm_as_interrupt

    token = service_token(args.host, args.token_file, "agentrl engine launch-sglang")
    extra = [a for a in args.extra if a != "--"]
    check_extra_args(extra, token)
    spec = SGLangLaunchSpec(model_path=args.model, num_servers=args.num_servers, tp=args.tp,
                            base_port=args.base_port, host=args.host,
                            gpus=[int(g) for g in args.gpus.split(",")] if args.gpus else None,
                            mem_fraction_static=args.mem_fraction_static, context_length=args.context_length,
                            dtype=args.dtype, enable_memory_saver=not args.no_memory_saver,
                            deterministic=args.deterministic, extra_args=extra, lora_rank=args.lora_rank,
                            lora_target_modules=args.lora_target_modules or [],
                            max_loras_per_batch=args.max_loras_per_batch)
    if args.dry_run:
        shown = replace(spec, api_key_config=API_KEY_CONFIG) if token else spec
        for env, cmd in sglang_server_commands(shown):
            print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd))
        if token:
            print(f"# {API_KEY_CONFIG}: a file of mode 600 holding 'api-key: <the token>', written at launch and "
                  "removed once the servers answer /health", flush=True)
        return 0
    sigterm_as_interrupt()  # `kill` stops the servers too, not only Ctrl-C
    with launch_sglang_servers(spec, health_timeout_s=args.health_timeout, token=token) as servers:
        if args.urls_file:
            with open(args.urls_file, "w") as f:
                f.write("\n".join(servers.urls) + "\n")
        print("SGLang servers ready:", " ".join(servers.urls), flush=True)
        print("use them with: engine.backend=sglang engine.urls=[" + ",".join(servers.urls) + "]", flush=True)
        servers.wait()
    return 0
