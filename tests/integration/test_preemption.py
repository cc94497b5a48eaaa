"""Policy preemption on the real engine: LAS retracts long-running requests for newcomers, and a
retracted request resumes without losing a token.

Two slots, two long requests running; two short newcomers arrive as soon as both long requests
have streamed a token, so they are usually already waiting when the long requests cross the
first LAS level (a slow host's client can still deliver them after the long requests ended: the
contended run is then tried again, a few times at most). At the
next quantum after that crossing LAS preempts the long requests
(scheduler/sglang_preemption.py retracts them the way SGLang's own retraction does), the
newcomers run, then the long requests resume from their generated tokens. Greedy decoding makes
the outcome checkable: each long request's output must be token-identical to an un-preempted
run of the same prompt, exactly max_new_tokens long, and SGLang must report the retraction.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from server.process import ServerProcess
from tests.integration.adapter_health import assert_policy_in_charge
from tests.integration.test_policies_on_engine import assert_serves_mixed_workload

MIXED_ON_ENGINE = ("las",)  # test_policies_on_engine's engine run for LAS happens here
LONG_TOKENS = 360  # far past LEVEL, so a long request is preempted with most of its tokens still to come
SHORT_TOKENS = 8
LEVEL = 48  # attained service (prompt + generated tokens) where the second LAS level starts
LONG_PROMPTS = ("the long request number one", "the long request number two")
SHORT_PROMPTS = ("short a", "short b")
CONTENTION_ATTEMPTS = 3  # runs until the newcomers reach the scheduler while the long requests run


def _params(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module", params=["overlap", "no-overlap"])
def las_two_slots(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """LAS with two slots, first level ending at LEVEL, a quantum every step, no starvation
    promotion; with SGLang's overlap scheduler (the CPU default) and without it."""
    extra = ["--disable-overlap-schedule"] if request.param == "no-overlap" else []
    with ServerProcess(
        "--model-path",
        "tiny",
        "--slo-policy",
        "las",
        "--slo-policy-param",
        f"level_thresholds=[{LEVEL}]",
        "--slo-policy-param",
        "quantum_steps=1",
        "--slo-policy-param",
        "starvation_s=null",
        "--max-running-requests",
        "2",
        *extra,
        name=f"las-preempt-{request.param}",
    ) as server:
        yield server


def _generate(server: ServerProcess, text: str, max_new_tokens: int) -> dict:
    r = requests.post(
        server.url + "/generate", json={"text": text, "sampling_params": _params(max_new_tokens)}, timeout=300
    )
    assert r.status_code == 200, r.text
    return r.json()


def _flush_cache(server: ServerProcess) -> None:
    """SGLang refuses a flush (400) while the scheduler still holds a request, which it may for
    a step after the last answer went out (overlap scheduling); it flushes once idle."""
    deadline = time.monotonic() + 120
    while (status := requests.post(server.url + "/flush_cache", timeout=30).status_code) != 200:
        assert status == 400 and time.monotonic() < deadline, status
        time.sleep(0.2)


def _stream(server: ServerProcess, text: str, max_new_tokens: int, progressed: threading.Event, after: int) -> dict:
    """Generate with streaming; set `progressed` once `after` tokens have come out. Returns the
    last chunk (cumulative text, output_ids and meta_info)."""
    body = {"text": text, "sampling_params": _params(max_new_tokens), "stream": True}
    last: dict = {}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=300) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            last = json.loads(line[len(b"data:") :])
            if last["meta_info"]["completion_tokens"] >= after:
                progressed.set()
    progressed.set()
    return last


def _contend(server: ServerProcess) -> dict[str, dict]:
    """Two long requests in the two slots, then the two newcomers once both have streamed a
    token; every request's last answer, by prompt."""
    results: dict[str, dict] = {}
    events = [threading.Event() for _ in LONG_PROMPTS]

    def run_long(prompt: str, progressed: threading.Event) -> None:
        results[prompt] = _stream(server, prompt, LONG_TOKENS, progressed, after=1)

    def run_short(prompt: str) -> None:
        results[prompt] = _generate(server, prompt, SHORT_TOKENS)

    threads = [threading.Thread(target=run_long, args=(p, e)) for p, e in zip(LONG_PROMPTS, events, strict=True)]
    for t in threads:
        t.start()
    for e in events:
        assert e.wait(timeout=120), "a long request never started streaming"
    for p in SHORT_PROMPTS:
        threads.append(threading.Thread(target=run_short, args=(p,)))
        threads[-1].start()
    for t in threads:
        t.join(timeout=300)
    assert set(results) == set(LONG_PROMPTS) | set(SHORT_PROMPTS), "a request did not finish"
    return results


def test_preempted_request_resumes_token_identical(las_two_slots: ServerProcess) -> None:
    """Up to CONTENTION_ATTEMPTS contended runs, each checked in full, until one has a
    retraction: a client on a slow host can deliver the newcomers only after the long requests
    ended (nothing to preempt then), which one run in many loses; LAS that does not preempt
    loses every run."""
    server = las_two_slots
    reference = {p: _generate(server, p, LONG_TOKENS) for p in LONG_PROMPTS}
    for out in reference.values():
        assert out["meta_info"]["completion_tokens"] == LONG_TOKENS
        assert out["meta_info"].get("num_retractions", 0) == 0, "the reference run must not be preempted"

    retractions = 0
    for _ in range(CONTENTION_ATTEMPTS):
        # Forget earlier runs' KV: a resumed request must recompute its own, not hit their prefix.
        _flush_cache(server)
        results = _contend(server)
        for p in LONG_PROMPTS:  # preempted or not, nothing is lost, duplicated or changed
            out, ref = results[p], reference[p]
            meta = out["meta_info"]
            assert meta["finish_reason"]["type"] == "length", meta["finish_reason"]
            assert meta["completion_tokens"] == LONG_TOKENS, "tokens were lost or duplicated across the retraction"
            assert len(out["output_ids"]) == LONG_TOKENS
            assert out["output_ids"] == ref["output_ids"], "the resumed request diverged from the un-preempted run"
            assert out["text"] == ref["text"]
        for p in SHORT_PROMPTS:
            assert results[p]["meta_info"]["completion_tokens"] == SHORT_TOKENS
            assert results[p]["meta_info"].get("num_retractions", 0) == 0, "LAS never preempts the newcomers"
        # How many long requests LAS preempts depends on when each newcomer reaches the scheduler
        # (one victim per waiting newcomer at a quantum), but at least one must have been retracted.
        retractions += sum(results[p]["meta_info"].get("num_retractions", 0) for p in LONG_PROMPTS)
        if retractions:
            break
    assert retractions >= 1, f"LAS preempted no long request for the newcomers in {CONTENTION_ATTEMPTS} runs"
    # The adapter counts exactly the retractions SGLang reports per request.
    status = server.status_when(lambda s: s["engine"].get("preempted", 0) >= retractions)
    assert status["engine"]["preempted"] == retractions
    assert_policy_in_charge(status["engine"])


def test_the_policys_views_count_the_running_requests_cached_tokens(las_two_slots: ServerProcess) -> None:
    """A running request's KV (its prompt, after its prefill) is cached prefix to the policy: the
    views read it from SGLang's request (a view that read none would price every running request
    as if its prompt were still to prefill). Two requests fill the two slots; a third is sent only
    once both have streamed a token (their prefill is done), so it waits while they run and the
    policy plans passes over running requests that hold their prompts' KV. Sending all three at
    once let a slow host's client deliver them one after another, with no pass over a running one."""
    before = las_two_slots.status_when(lambda s: bool(s["engine"]))["engine"]["view_cached_prefix_tokens"]
    prompts = [f"the cached prefix request number {i} " * 4 for i in range(2)]
    events = [threading.Event() for _ in prompts]
    threads = [
        threading.Thread(target=_stream, args=(las_two_slots, p, LONG_TOKENS, e, 1))
        for p, e in zip(prompts, events, strict=True)
    ]
    for t in threads:
        t.start()
    for e in events:
        assert e.wait(timeout=120), "a request never started streaming"
    newcomer = _generate(las_two_slots, "the cached prefix newcomer", SHORT_TOKENS)
    assert newcomer["meta_info"]["completion_tokens"] == SHORT_TOKENS
    for t in threads:
        t.join(timeout=300)
    engine = las_two_slots.status_when(lambda s: s["engine"]["running"] == 0)["engine"]
    assert engine["view_cached_prefix_tokens"] > before
    assert_policy_in_charge(engine)


def test_no_preemption_without_contention(las_two_slots: ServerProcess) -> None:
    """With free slots LAS has nobody to preempt for: outputs are untouched."""
    out = _generate(las_two_slots, LONG_PROMPTS[0], 64)
    assert out["meta_info"]["completion_tokens"] == 64
    assert out["meta_info"].get("num_retractions", 0) == 0


def test_las_serves_a_mixed_workload(las_two_slots: ServerProcess) -> None:
    """test_policies_on_engine's engine run for LAS, on this module's servers; after the test that
    asserts preempted == retractions, whose count must not include this workload's."""
    assert_serves_mixed_workload(las_two_slots, "las")


# ---- which requests retract_requests takes (SGLang's objects stubbed) ----------------------------


class _Mode:
    def __init__(self, extend: bool) -> None:
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


class _Req:
    def __init__(self, rid: str, generated: int = 3, finished: bool = False) -> None:
        from sglang.srt.managers.schedule_batch import ReqKvInfo

        self.rid = rid
        self.origin_input_ids = [1, 2]
        self.output_ids = list(range(generated))
        self._finished = finished
        self.is_retracted = False
        self.kv = ReqKvInfo(req_pool_idx=0)  # SGLang's own record of the request's KV row
        self.beam_group = None

    def finished(self) -> bool:
        return self._finished


class _Batch:
    def __init__(self, reqs: list[_Req], extend: bool = False) -> None:
        self.reqs = reqs
        self.forward_mode = _Mode(extend)
        self.batch_is_full = True
        self.released: list[str] = []

    def is_empty(self) -> bool:
        return not self.reqs

    def release_req(self, idx: int, remaining: int) -> None:
        req = self.reqs[idx]
        self.released.append(req.rid)
        req.kv.req_pool_idx = None
        req.is_retracted = True

    def filter_batch(self, keep_indices: list[int]) -> None:
        self.reqs = [self.reqs[i] for i in keep_indices]


class _Allocator:
    def available_size(self) -> int:
        return 0


class _Scheduler:
    def __init__(self, overlap: bool, last_batch: _Batch | None, chunked: _Req | None) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode

        self.enable_overlap = overlap
        self.last_batch = last_batch
        self.chunked_req = chunked
        self.disaggregation_mode = DisaggregationMode.NULL
        self.dllm_config = None
        self.server_args = None
        self.token_to_kv_pool_allocator = _Allocator()
        self.queued: list[tuple[str, bool]] = []

    def _add_request_to_queue(self, req: _Req, is_retracted: bool = False) -> None:
        self.queued.append((req.rid, is_retracted))


@pytest.mark.parametrize("overlap", [True, False])
def test_only_decoding_requests_are_retracted(overlap: bool) -> None:
    from scheduler.sglang_preemption import retract_requests

    decoding, chunked, fresh, done = _Req("decoding"), _Req("chunked"), _Req("fresh", 0), _Req("done", finished=True)
    just_prefilled, other = _Req("just-prefilled", 1), _Req("other")
    batch = _Batch([decoding, chunked, fresh, done, just_prefilled, other])
    in_flight_prefill = _Batch([just_prefilled], extend=True)
    sched = _Scheduler(overlap, in_flight_prefill, chunked)
    wanted = {"decoding", "chunked", "fresh", "done", "just-prefilled", "unknown"}

    got = retract_requests(sched, batch, wanted)

    # Under overlap the last prefill batch is still in flight: its requests are not decoding yet.
    expect = ["decoding"] if overlap else ["decoding", "just-prefilled"]
    assert [r.rid for r in got] == expect
    assert batch.released == expect
    assert sched.queued == [(rid, True) for rid in expect]
    assert [r.rid for r in batch.reqs] == [
        r for r in ("decoding", "chunked", "fresh", "done", "just-prefilled", "other") if r not in expect
    ]
    assert not batch.batch_is_full
    assert all(r.output_ids for r in got), "generated tokens are kept"


def test_nothing_to_retract_leaves_the_batch_alone() -> None:
    from scheduler.sglang_preemption import retract_requests

    batch = _Batch([_Req("a"), _Req("b", 0)])
    sched = _Scheduler(False, None, None)
    assert retract_requests(sched, batch, {"b", "zzz"}) == []
    assert retract_requests(sched, batch, set()) == []
    assert [r.rid for r in batch.reqs] == ["a", "b"] and batch.batch_is_full and not sched.queued


def test_a_request_without_a_kv_row_is_not_retracted_and_one_with_it_is() -> None:
    """The blocker reads SGLang's own KV record of the request (`Req.kv`): a decoding request
    that holds its row is retracted, one whose row is gone is skipped."""
    from scheduler.sglang_preemption import retraction_blocker

    holding, released = _Req("holding"), _Req("released")
    released.kv.req_pool_idx = None
    sched = _Scheduler(False, None, None)
    assert retraction_blocker(sched, holding) is None
    assert retraction_blocker(sched, released) == "holds no KV"
