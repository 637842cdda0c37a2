"""`agentrl serve-policy`: the OpenAI-compatible policy front (`agent_loop.openai_front`) as a standalone server."""

from __future__ import annotations

from agentrl.auth import TOKEN_HELP


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("serve-policy", help="serve a policy over the OpenAI chat API (/v1/chat/completions), "
                                                   "recording every call token for token per episode")
    p.add_argument("--model", required=True, help="Hugging Face model directory (the tokenizer and, for the local "
                                                  "engine, the weights)")
    p.add_argument("--port", type=int, required=True, help="port to listen on (0: pick a free one)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1); any other needs a token")
    p.add_argument("--token-file", default=None, metavar="PATH", help=TOKEN_HELP)
    p.add_argument("--engine-url", action="append", default=[], metavar="URL",
                   help="an SGLang server (or `agentrl engine serve`) to sample from; repeat for several. "
                        "Default: a LocalEngine in this process")
    p.add_argument("--engine-token-file", default=None, metavar="PATH", help="bearer token of the --engine-url servers")
    p.add_argument("--replicas", type=int, default=1, help="local engine replicas (Ray actors)")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="cap on one completion's tokens")
    p.add_argument("--model-name", default="agentrl-policy", help="the model id /v1/models answers")
    p.add_argument("--tool-parser", default="hermes", help="how tool calls are read from the model's text")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=_serve_policy)


def _serve_policy(args) -> int:
    from agentrl.auth import service_token

    token = service_token(args.host, args.token_file, "agentrl serve-policy")
    from transformers import AutoTokenizer

    from agentrl.agent_loop.openai_front import PolicyFront
    from agentrl.agent_loop.openai_server import create_app
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.services import bind_port, serve_asgi

    config = EngineConfig(backend="sglang" if args.engine_url else "local", urls=args.engine_url,
                          replicas=args.replicas, max_model_len=args.max_model_len,
                          token_file=args.engine_token_file)
    with bind_port(args.host, args.port) as sock:  # a taken port fails before the model loads
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        engine = make_engine(config, args.model)
        front = PolicyFront(engine, tokenizer, model_name=args.model_name, tool_parser=args.tool_parser,
                            max_new_tokens=args.max_new_tokens, max_model_len=args.max_model_len)
        try:
            serve_asgi(create_app(front, token=token), sock,
                       lambda url: f"policy front ready on {url}/v1 (model {args.model}, engine {config.backend}); "
                                   f"give each agent episode base_url {url}/episodes/<episode id>/v1",
                       log_level=args.log_level)
        finally:
            close = getattr(engine, "close_sync", None)
            if close is not None:
                close()
    return 0
