"""SGLang's native `/generate` wire format (sglang 0.5.x `GenerateReqInput`), shared by client and server.

Client side: `sampling_params_to_wire` sends every sampling value explicitly (SGLang 0.5.23 fills omitted ones
from the model's generation_config.json) with `skip_special_tokens=false` and `no_stop_trim=true`;
`generation_from_wire` reads `output_ids` + `meta_info.output_token_logprobs` back into a `Generation`, and the
weight version of each token from `meta_info.weight_versions`, SGLang's spans `[{"version", "start", "end"}]`
over the output tokens (sglang 0.5.23), or, where an answer has no spans (older releases), from its one
`meta_info.weight_version` label for every token (`version_from_label`).
Server side: `sampling_params_from_wire` honours SGLang's fields (`ignore_eos` and `min_new_tokens` included)
and rejects, by name, the ones the local engine cannot honour (a non-neutral penalty, `min_p`, `n > 1`,
`stop_regex`, constrained decoding, ...); `weight_version_spans` writes the spans.
tests/unit/inference/test_sglang_wire_schema.py checks both sides against SGLang's own definitions.
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
        "min_new_tokens": params.min_new_tokens,
        "ignore_eos": params.ignore_eos,
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "n": 1,
    }
    if params.seed is not None:
        out["sampling_seed"] = params.seed
    return out


# SGLang's sampling_params (sglang `srt/sampling/sampling_params.py`), each honoured or refused by name.
# field -> the only value the local engine can honour (anything else is rejected with a clear message)
# (an empty list or object counts as neutral too: SGLang's defaults of logit_bias and choice are {} and [])
_NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "n": 1, "stop_regex": None, "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
            "logit_bias": None, "custom_params": None, "stream_interval": None, "beam_width": None,
            "watermark": None, "choice": None}
# honoured: by the engine (SamplingParams) or by the server when it renders the text
_ENGINE_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed",
                  "ignore_eos", "min_new_tokens")
_TEXT_FIELDS = {"skip_special_tokens": True, "no_stop_trim": False, "spaces_between_special_tokens": True}


def sampling_params_from_wire(d: dict | None, *, max_new_tokens_default: int = 128,
                              ) -> tuple[SamplingParams, dict[str, bool]]:
    """SGLang sampling_params -> (SamplingParams, text options {skip_special_tokens, no_stop_trim,
    spaces_between_special_tokens}).

    A null value means the field's default, as in SGLang; `max_new_tokens: null` means "until the context is
    full" (`max_new_tokens_default`, the server's context length). Raises WireError naming a field the engine
    cannot honour or a value of the wrong type.
    """
    if d is not None and not isinstance(d, dict):
        raise WireError(f"sampling_params must be an object, got {type(d).__name__}")
    given = dict(d or {})
    known = set(_NEUTRAL) | set(_TEXT_FIELDS) | set(_ENGINE_FIELDS)
    unknown = sorted(k for k in given if k not in known)
    if unknown:
        raise WireError(f"sampling_params fields {unknown} are not SGLang sampling parameters "
                        f"(known: {sorted(known)})")
    for key, neutral in _NEUTRAL.items():
        if given.get(key) not in (None, [], {}) and given[key] != neutral:
            raise WireError(f"sampling_params.{key}={given[key]!r} is not supported by agentrl engine serve "
                            f"(only {neutral!r}); use a real SGLang server for it")
    d = {k: v for k, v in given.items() if v is not None}
    for key in ("ignore_eos", *_TEXT_FIELDS):
        if key in d and not isinstance(d[key], bool):
            raise WireError(f"sampling_params.{key} must be true or false, got {d[key]!r}")
    for key in ("max_new_tokens", "min_new_tokens", "top_k", "sampling_seed"):
        if key in d and (isinstance(d[key], bool) or not isinstance(d[key], int)):
            raise WireError(f"sampling_params.{key} must be an integer, got {d[key]!r}")
    stop = d.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    try:
        params = SamplingParams(
            max_new_tokens=d.get("max_new_tokens", max_new_tokens_default),
            temperature=float(d.get("temperature", 1.0)),
            top_p=float(d.get("top_p", 1.0)),
            top_k=d.get("top_k", -1),
            stop_token_ids=[int(t) for t in d.get("stop_token_ids") or []],
            stop=[str(s) for s in stop],
            seed=d.get("sampling_seed"),
            ignore_eos=d.get("ignore_eos", False),
            min_new_tokens=d.get("min_new_tokens", 0),
        )
    except (TypeError, ValueError) as e:
        raise WireError(f"bad sampling_params: {e}") from None
    return params, {key: d.get(key, default) for key, default in _TEXT_FIELDS.items()}


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


def version_from_label(label: Any) -> int | None:
    """An SGLang weight_version label as a version number: "default" (SGLang's label of the weights it started
    with) is 0, an integer label ("3") its value; any other label has no number (None)."""
    if label == "default":
        return 0
    if isinstance(label, int) and not isinstance(label, bool):
        return label
    if isinstance(label, str) and label.strip().isdigit():
        return int(label)
    return None


def weight_version_spans(labels: list[str], last: str) -> list[dict[str, Any]]:
    """Per-token weight version labels -> SGLang's `meta_info.weight_versions`: spans of equal labels,
    `{"version", "start", "end"}` with `end` exclusive; no tokens: one empty span of `last`, as SGLang says it."""
    spans: list[dict[str, Any]] = []
    for i, label in enumerate(labels):
        if spans and spans[-1]["version"] == label:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": label, "start": i, "end": i + 1})
    return spans or [{"version": last, "start": 0, "end": 0}]


def _labels_from_spans(spans: Any, n: int) -> list[Any] | None:
    """SGLang's weight version spans -> one label per output token; None unless they tile [0, n) in order."""
    if not isinstance(spans, list):
        return None
    labels: list[Any] = []
    for span in spans:
        if not isinstance(span, dict) or span.get("start") != len(labels) or not isinstance(span.get("end"), int):
            return None
        labels += [span.get("version")] * (span["end"] - span["start"])
    return labels if len(labels) == n else None


def _weight_versions(meta: dict, n: int) -> list[int]:
    """One version per output token, or [] when a label is not a number (see `version_from_label`) or the spans
    do not cover the output tokens."""
    spans = meta.get("weight_versions")
    labels = [meta.get("weight_version")] * n if spans is None else _labels_from_spans(spans, n)
    versions = [version_from_label(label) for label in labels or []]
    return [] if labels is None or None in versions else versions


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
                      metrics=metrics, weight_versions=_weight_versions(meta, len(ids)))


__all__ = ["WireError", "sampling_params_to_wire", "sampling_params_from_wire", "finish_reason_to_wire",
           "finish_reason_from_wire", "generation_from_wire", "version_from_label", "weight_version_spans"]
