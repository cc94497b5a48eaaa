"""Calls the lever tests make on a running server: one /generate with an SLO, and waiting until
the engine runs a request."""

from __future__ import annotations

import time

import requests

from server.process import ServerProcess


def generate(url: str, ids: list[int], slo: dict, max_new: int) -> dict:
    """meta_info of one /generate that must succeed; `max_new` tokens exactly (ignore_eos)."""
    body = {"input_ids": ids, "slo": slo, "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}
    r = requests.post(url + "/generate", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def wait_until_running(server: ServerProcess, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server.status_when(lambda s: True)["engine"]["running"] < 1:
        assert time.monotonic() < deadline, "no request ever started"
        time.sleep(0.05)
