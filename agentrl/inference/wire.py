"""SGLang's native `/generate` wire format (sglang 0.5.x `GenerateReqInput`), shared by client and server.

Client side: `sampling_params_to_wire` sends every sampling value explicitly (SGLang 0.5.23 fills omitted ones
from the model's generation_config.json) with `skip_special_tokens=false` and `no_stop_trim=true`;
`generation_from_wire` reads `output_ids` + `meta_info.output_token_logprobs` back into a `Generation`.
Server side: `sampling_params_from_wire` accepts SGLang's fields and rejects, by name, the ones the local engine
cannot honour (a non-neutral penalty, `min_p`, `n > 1`, constrained decoding, ...).
"""

from __future__ import annotations

from typing import Any

from agentrl.types import Generation, SamplingParams


class WireError(ValueError):
    """A request the server cannot honour; becomes HTTP 400 {"error": {"message": ...}}."""


def sampling_params_to_wire(params: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "min_new_tokens": 0,
        "ignore_eos": False,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "n": 1,
    }
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out


# field -> the only value the local engine can honour (anything else is rejected with a clear message)
_NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "min_new_tokens": 0, "ignore_eos": False, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
            "structural_tag": None, "logit_bias": None, "custom_params": None, "stream_interval": None}
# accepted and used by the server (text rendering) or harmless
_TEXT_FIELDS = ("skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens")
_ENGINE_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed")


def sampling_params_from_wire(d: dict | None) -> tuple[SamplingParams, dict[str, bool]]:
    """SGLang sampling_params -> (SamplingParams, text options {skip_special_tokens, no_stop_trim})."""
    if d is not None and not isinstance(d, dict):
        raise WireError(f"sampling_params must be an object, got {type(d).__name__}")
    d = dict(d or {})
    known = set(_NEUTRAL) | set(_TEXT_FIELDS) | set(_ENGINE_FIELDS)
    unknown = sorted(k for k in d if k not in known)
    if unknown:
        raise WireError(f"sampling_params fields {unknown} are not supported by agentrl engine serve "
                        f"(supported: {sorted(known)})")
    for key, neutral in _NEUTRAL.items():
        if key in d and d[key] is not None and d[key] != neutral:
            raise WireError(f"sampling_params.{key}={d[key]!r} is not supported by agentrl engine serve "
                            f"(only {neutral!r}); use a real SGLang server for it")
    stop = d.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    try:
        params = SamplingParams(
            max_new_tokens=int(d.get("max_new_tokens", 128)),
            temperature=float(d.get("temperature", 1.0)),
            top_p=float(d.get("top_p", 1.0)),
            top_k=int(d.get("top_k", -1)),
            stop_token_ids=[int(t) for t in d.get("stop_token_ids") or []],
            stop=[str(s) for s in stop],
            seed=None if d.get("sampling_seed") is None else int(d["sampling_seed"]),
        )
    except (TypeError, ValueError) as e:
        raise WireError(f"bad sampling_params: {e}") from None
    text_options = {"skip_special_tokens": bool(d.get("skip_special_tokens", True)),
                    "no_stop_trim": bool(d.get("no_stop_trim", False))}
    return params, text_options


def finish_reason_to_wire(reason: str, matched: int | str | None, completion_tokens: int,
                          message: str = "") -> dict[str, Any]:
    if reason == "stop":
        return {"type": "stop", "matched": matched}
    if reason == "length":
        return {"type": "length", "length": completion_tokens}
    return {"type": "abort", "message": message or "request aborted"}


def finish_reason_from_wire(obj: Any) -> str:
    """SGLang finish_reason ({"type": ...} or null while streaming) -> "stop" | "length" | "abort"."""
    kind = obj.get("type") if isinstance(obj, dict) else obj
    if kind in ("stop", "length", "abort"):
        return kind
    raise ValueError(f"unknown SGLang finish_reason {obj!r}")


def generation_from_wire(resp: dict) -> Generation:
    """One /generate response item (requested with return_logprob=true) -> Generation."""
    meta = resp["meta_info"]
    ids = [int(t) for t in resp["output_ids"]]
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ValueError("SGLang response has no meta_info.output_token_logprobs: request with return_logprob=true")
    logprobs = [float(e[0]) for e in entries]
    if len(logprobs) != len(ids) or any(int(e[1]) != t for e, t in zip(entries, ids)):
        raise ValueError(f"SGLang returned {len(ids)} output_ids but {len(logprobs)} logprob entries "
                         f"(or mismatched ids): the server must keep the stop token (no_stop_trim=true)")
    metrics = {k: meta[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                                    "weight_version") if k in meta}
    metrics["finish_detail"] = meta.get("finish_reason")
    return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish_reason_from_wire(meta["finish_reason"]),
                      metrics=metrics)


__all__ = ["WireError", "sampling_params_to_wire", "sampling_params_from_wire", "finish_reason_to_wire",
           "finish_reason_from_wire", "generation_from_wire"]
