"""SGLang's /generate sampling_params on both ends: what the client sends, what the server honours or refuses."""

from __future__ import annotations

import pytest

from agentrl.inference.wire import WireError, sampling_params_from_wire, sampling_params_to_wire
from agentrl.types import SamplingParams


def test_every_sampling_value_round_trips():
    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, top_k=20, stop_token_ids=[5, 6],
                            stop=["</answer>"], seed=3, ignore_eos=True, min_new_tokens=8)
    wire = sampling_params_to_wire(params)
    assert wire["ignore_eos"] is True and wire["min_new_tokens"] == 8 and wire["sampling_seed"] == 3
    assert wire["skip_special_tokens"] is False and wire["no_stop_trim"] is True  # the token-exact settings
    back, text = sampling_params_from_wire(wire)
    assert back == params
    assert text == {"skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": True}


def test_nulls_mean_sglang_defaults_and_max_new_tokens_null_fills_the_context():
    params, text = sampling_params_from_wire({"max_new_tokens": None, "temperature": None, "top_k": None,
                                              "ignore_eos": None, "min_p": None, "stop": "x"},
                                             max_new_tokens_default=512)
    assert params == SamplingParams(max_new_tokens=512, stop=["x"])
    assert text["skip_special_tokens"] is True and text["no_stop_trim"] is False  # SGLang's defaults
    assert sampling_params_from_wire(None)[0] == SamplingParams(max_new_tokens=128)


@pytest.mark.parametrize("sampling_params, message", [
    ({"min_p": 0.05}, r"sampling_params\.min_p=0\.05 is not supported"),
    ({"repetition_penalty": 1.1}, r"sampling_params\.repetition_penalty"),
    ({"stop_regex": "[0-9]+"}, r"sampling_params\.stop_regex"),
    ({"json_schema": "{}"}, r"sampling_params\.json_schema"),
    ({"n": 4}, r"sampling_params\.n=4"),
    ({"ignore_eos": 1}, r"sampling_params\.ignore_eos must be true or false"),
    ({"min_new_tokens": 2.5}, r"sampling_params\.min_new_tokens must be an integer"),
    ({"max_new_tokens": 4, "min_new_tokens": 9}, r"min_new_tokens must be in \[0, max_new_tokens=4\]"),
    ({"temperatur": 0.5}, r"fields \['temperatur'\] are not SGLang sampling parameters"),
    ([1, 2], "must be an object"),
])
def test_fields_the_engine_cannot_honour_are_refused_by_name(sampling_params, message):
    with pytest.raises(WireError, match=message):
        sampling_params_from_wire(sampling_params)


def test_neutral_values_of_unsupported_fields_are_accepted():
    params, _ = sampling_params_from_wire({"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                                           "repetition_penalty": 1.0, "n": 1, "logit_bias": None})
    assert params == SamplingParams(max_new_tokens=128)


def test_weight_version_labels_become_per_token_versions():
    from agentrl.inference.wire import generation_from_wire, version_from_label

    assert [version_from_label(x) for x in ("default", "12", 3, "step-3", None)] == [0, 12, 3, None, None]
    meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-1.0, 5, None], [-2.0, 6, None]]}
    per_request = generation_from_wire({"output_ids": [5, 6], "meta_info": {**meta, "weight_version": "2"}})
    assert per_request.weight_versions == [2, 2]
    spans = [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}]
    per_token = generation_from_wire({"output_ids": [5, 6], "meta_info": {**meta, "weight_version": "3",
                                                                           "weight_versions": spans}})
    assert per_token.weight_versions == [2, 3] and per_token.metrics["weight_version"] == "3"
    gap = [{"version": "2", "start": 0, "end": 1}]  # spans that miss a token: no version rather than a wrong one
    assert generation_from_wire({"output_ids": [5, 6], "meta_info": {**meta, "weight_version": "2",
                                                                     "weight_versions": gap}}).weight_versions == []
    unnamed = generation_from_wire({"output_ids": [5, 6], "meta_info": {**meta, "weight_version": "rl-step"}})
    assert unnamed.weight_versions == []
