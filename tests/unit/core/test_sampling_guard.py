"""The sampling-params guard: values SGLang 0.5.17 would crash or 500 on are refused with the
field named; what real clients send (JSON ints for floats, lists of stops, bias maps) passes."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.sampling_guard import (
    MAX_N,
    BadParam,
    check_generate_fields,
    check_sampling_params,
    check_sampling_value,
)

VOCAB = 512


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"logit_bias": {"5": "x"}}, "sampling_params.logit_bias.5"),  # crashed SGLang's scheduler
        ({"logit_bias": {"5": None}}, "sampling_params.logit_bias.5"),
        ({"logit_bias": {"5": 1e300}}, "sampling_params.logit_bias.5"),  # inf in a float32 tensor
        ({"logit_bias": {"512": 1}}, "sampling_params.logit_bias.512"),  # past the vocabulary
        ({"logit_bias": {"-1": 1}}, "sampling_params.logit_bias.-1"),
        ({"logit_bias": {"x": 1}}, "sampling_params.logit_bias.x"),
        ({"logit_bias": {"true": 1}}, "sampling_params.logit_bias.true"),
        ({"logit_bias": [1, 2]}, "sampling_params.logit_bias"),
        ({"skip_special_tokens": "x"}, "sampling_params.skip_special_tokens"),  # crashed the detokenizer
        ({"skip_special_tokens": 1}, "sampling_params.skip_special_tokens"),  # the tokenizer's decode takes a bool
        ({"ignore_eos": "yes"}, "sampling_params.ignore_eos"),
        ({"nil": 1}, "sampling_params.nil"),  # a TypeError in SamplingParams(**params)
        ({"stop_strs": ["x"]}, "sampling_params.stop_strs"),  # internal fields are not the client's
        ({"temperature": "x"}, "sampling_params.temperature"),
        ({"temperature": -0.5}, "sampling_params.temperature"),
        ({"temperature": True}, "sampling_params.temperature"),
        ({"top_p": 0}, "sampling_params.top_p"),
        ({"top_p": 1.5}, "sampling_params.top_p"),
        ({"top_k": 0}, "sampling_params.top_k"),
        ({"top_k": 2**40}, "sampling_params.top_k"),  # past the int32 tensor
        ({"min_p": 2}, "sampling_params.min_p"),
        ({"frequency_penalty": 3}, "sampling_params.frequency_penalty"),
        ({"repetition_penalty": 0}, "sampling_params.repetition_penalty"),
        ({"stop": 5}, "sampling_params.stop"),
        ({"stop": ["a", 5]}, "sampling_params.stop"),
        ({"stop": ["a"] * 65}, "sampling_params.stop"),
        ({"stop_token_ids": [1, "2"]}, "sampling_params.stop_token_ids[1]"),
        ({"stop_token_ids": [VOCAB]}, "sampling_params.stop_token_ids[0]"),
        ({"stop_token_ids": 3}, "sampling_params.stop_token_ids"),
        ({"stop_regex": "(a+)+$"}, "sampling_params.stop_regex"),
        ({"max_new_tokens": "x"}, "sampling_params.max_new_tokens"),
        ({"max_new_tokens": -1}, "sampling_params.max_new_tokens"),
        ({"max_new_tokens": 2.0}, "sampling_params.max_new_tokens"),
        ({"min_new_tokens": 5, "max_new_tokens": 2}, "sampling_params.min_new_tokens"),
        ({"n": 0}, "sampling_params.n"),
        ({"n": MAX_N + 1}, "sampling_params.n"),  # SGLang copies the prompt n times first
        ({"sampling_seed": 2**63}, "sampling_params.sampling_seed"),  # past the int64 tensor
        ({"stream_interval": 0}, "sampling_params.stream_interval"),
        ({"json_schema": {"type": "object"}}, "sampling_params.json_schema"),
        ({"regex": "a", "ebnf": "root ::= 'a'"}, "sampling_params.ebnf"),
        ({"custom_params": [1]}, "sampling_params.custom_params"),
    ],
)
def test_bad_sampling_params_are_refused_naming_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(BadParam) as caught:
        check_sampling_params(params, vocab_size=VOCAB)
    assert caught.value.field == field, caught.value
    assert caught.value.message


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"max_new_tokens": 16, "temperature": 0},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
        {"temperature": 1, "top_p": 1, "top_k": -1, "frequency_penalty": -2, "presence_penalty": 2},
        {"stop": "x", "stop_token_ids": [2, 3], "stop_regex": r"\n\s{0,8}\n", "no_stop_trim": True},
        {"stop": ["wörld", "日本", ""], "ignore_eos": False, "skip_special_tokens": False},
        {"logit_bias": {"5": -100, "7": 2.5}, "sampling_seed": 42, "n": 2},
        {"json_schema": '{"type": "object"}', "regex": None, "ebnf": ""},
        {"custom_params": {"slo": {"ttft_ms": 5}, "x": [1, 2]}, "stream_interval": 4},
        {"temperature": None, "top_p": None, "max_new_tokens": None},  # SGLang's defaults
    ],
)
def test_real_clients_params_pass(params: dict[str, Any]) -> None:
    check_sampling_params(params, vocab_size=VOCAB)


def test_a_batch_names_the_item_and_refuses_an_empty_list() -> None:
    with pytest.raises(BadParam) as caught:
        check_sampling_params([{"temperature": 1}, {"logit_bias": {"5": "x"}}])
    assert caught.value.field == "sampling_params[1].logit_bias.5"
    with pytest.raises(BadParam) as caught:
        check_sampling_params([])  # an IndexError inside SGLang's batch normalisation
    assert caught.value.field == "sampling_params"
    with pytest.raises(BadParam):
        check_sampling_params("x")


def test_without_a_vocabulary_token_ids_are_bounded_by_int32() -> None:
    check_sampling_params({"logit_bias": {"100000": 1}, "stop_token_ids": [100000]})
    with pytest.raises(BadParam):
        check_sampling_params({"logit_bias": {str(2**31): 1}})


def test_one_value_is_named_by_the_callers_field() -> None:
    with pytest.raises(BadParam) as caught:
        check_sampling_value("sampling_seed", "x", "seed")
    assert caught.value.field == "seed"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"return_hidden_states": []}, "return_hidden_states"),  # crashed SGLang's scheduler
        ({"return_hidden_states": "all"}, "return_hidden_states"),
        ({"return_hidden_states": [True, 1]}, "return_hidden_states[1]"),
        ({"return_logprob": "x"}, "return_logprob"),
        ({"top_logprobs_num": -1}, "top_logprobs_num"),
        ({"logprob_start_len": "x"}, "logprob_start_len"),
        ({"token_ids_logprob": 5}, "token_ids_logprob"),
        ({"stream": "x"}, "stream"),
        ({"text": []}, "text"),
        ({"input_embeds": []}, "input_embeds"),
        ({"sampling_params": {"temperature": "x"}}, "sampling_params.temperature"),
        ({"lora_id": ["x"]}, "lora_id"),  # a list in a single request crashed SGLang's Req()
        ({"lora_path": ["x"]}, "lora_path"),
        ({"extra_key": ["a"]}, "extra_key"),
        ({"routing_key": 5}, "routing_key"),
        ({"session_params": {"colour": 1}}, "session_params.colour"),  # a TypeError (500) in SGLang
        ({"session_params": {"offset": "x"}}, "session_params.offset"),
        ({"session_params": "s"}, "session_params"),
        ({"sampling_params": {"n": None}}, "sampling_params.n"),  # a TypeError (500) in SGLang
    ],
)
def test_bad_generate_fields_are_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(BadParam) as caught:
        check_generate_fields({"text": "hi", **body})
    assert caught.value.field == field
    with pytest.raises(BadParam) as caught:
        check_generate_fields({"text": "hi", **body}, prefix="parameters.")
    assert caught.value.field == f"parameters.{field}"


@pytest.mark.parametrize(
    "body",
    [
        {"text": "hi", "return_hidden_states": True},
        {"text": ["a", "b"], "return_hidden_states": [False, "last"], "return_logprob": [True, False]},
        {"input_ids": [1, 2], "return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": -1},
        {"text": "hi", "token_ids_logprob": [1, 2], "stream": True, "sampling_params": None},
        {"text": "hi", "lora_path": "adapter-a", "extra_key": "salt", "routing_key": "user-7"},
        {"text": ["a", "b"], "lora_path": ["adapter-a", None], "extra_key": ["s1", "s2"]},
        {"input_ids": [[1, 2], [3]], "lora_id": ["x", "y"]},
        {"text": "hi", "session_params": {"id": "s1", "rid": None, "offset": 3, "replace": False}},
    ],
)
def test_real_generate_bodies_pass(body: dict[str, Any]) -> None:
    check_generate_fields(body)
