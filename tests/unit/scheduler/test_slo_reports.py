"""SloReportBook (token stamps -> per-request report, compound deadlines, aborts) and the
SloMetrics counters it feeds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import scheduler.reporting.reports as slo_reports
from scheduler.core.slo import SloClass, SloSpec
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from wire import REPORT_KEY, TOKEN_TS_KEY

LAT = SloSpec(ttft_ms=100.0, tpot_ms=10.0, slo_class=SloClass.LATENCY)
DL = SloSpec(deadline_ms=1000.0, slo_class=SloClass.DEADLINE)
STOP = {"type": "stop", "matched": None}
ABORT = {"type": "abort", "message": "client gone"}


@pytest.fixture
def book():
    return SloReportBook(SloMetrics())


@pytest.fixture
def frozen_now(monkeypatch):
    """Pin the wall clock the book uses for requests that end without a last token."""
    now = {"t": 0.0}
    monkeypatch.setattr(slo_reports, "time", SimpleNamespace(time=lambda: now["t"]))
    return now


def _count(book, cls, result):
    value = book.metrics.registry.get_sample_value("sglang_slo_requests_total", {"slo_class": cls, "result": result})
    return 0.0 if value is None else value


def _meta(rid, stamps=None, completion_tokens=None, finish=None, **extra):
    meta = {"id": rid, "finish_reason": finish, **extra}
    if stamps is not None:
        meta[TOKEN_TS_KEY] = list(stamps)
    if completion_tokens is not None:
        meta["completion_tokens"] = completion_tokens
    return meta


# --- token stamps ---------------------------------------------------------------------------------


def test_cumulative_non_streaming_output(book):
    book.start("r", LAT, 100.0)
    meta = _meta("r", [100.05, 100.105, 100.2], completion_tokens=3, finish=STOP)
    book.on_output(meta)
    assert TOKEN_TS_KEY not in meta
    report = meta[REPORT_KEY]
    assert report["output_tokens"] == 3
    assert report["ttft_ms"] == pytest.approx(50.0, abs=1e-3)
    assert report["e2e_ms"] == pytest.approx(200.0, abs=1e-3)  # finish = last token time
    assert report["on_time_tokens"] == 2  # token 2 due at 120 ms came at 200 ms
    assert report["attained"] == {"ttft": True, "tpot": False, "deadline": None, "overall": False}
    assert book.report("r") == report


def test_incremental_streaming_chunks_accumulate(book):
    book.start("s", LAT, 0.0)
    chunks = [
        _meta("s", [0.05], completion_tokens=1),
        _meta("s", [0.10, 0.11], completion_tokens=3),
        _meta("s", [], completion_tokens=3),  # a chunk without new tokens
        _meta("s", [0.115], completion_tokens=4, finish=STOP),
    ]
    for meta in chunks[:-1]:
        book.on_output(meta)
        assert TOKEN_TS_KEY not in meta and REPORT_KEY not in meta
    assert book.report("s") is None  # nothing reported before the final chunk
    book.on_output(chunks[-1])
    report = chunks[-1][REPORT_KEY]
    assert report["output_tokens"] == 4
    assert report["e2e_ms"] == pytest.approx(115.0, abs=1e-3)
    # due 100, 110, 120, 130 ms; emitted 50, 100, 110, 115 ms: all on time
    assert report["on_time_tokens"] == 4
    assert report["attained"]["overall"] is True


def test_cumulative_stamps_on_each_chunk_replace_not_duplicate(book):
    # Some outputs re-send all stamps so far; length == completion_tokens marks them cumulative.
    book.start("c", LAT, 0.0)
    book.on_output(_meta("c", [0.05], completion_tokens=1))
    book.on_output(_meta("c", [0.05, 0.09], completion_tokens=2))
    final = _meta("c", [0.05, 0.09, 0.1], completion_tokens=3, finish=STOP)
    book.on_output(final)
    assert final[REPORT_KEY]["output_tokens"] == 3


def test_stamps_without_completion_tokens_are_incremental(book):
    book.start("n", DL, 0.0)
    book.on_output(_meta("n", [0.1, 0.2]))
    final = _meta("n", [0.3], finish="stop")  # a plain-string finish reason also ends the request
    book.on_output(final)
    assert final[REPORT_KEY]["output_tokens"] == 3
    assert final[REPORT_KEY]["attained"]["deadline"] is True


def test_untracked_rid_stamps_stripped_no_report(book):
    meta = _meta("ghost", [1.0], completion_tokens=1, finish=STOP)
    book.on_output(meta)
    assert TOKEN_TS_KEY not in meta and REPORT_KEY not in meta
    assert book.report("ghost") is None
    meta_no_id = {TOKEN_TS_KEY: [1.0], "finish_reason": STOP}
    book.on_output(meta_no_id)
    assert meta_no_id == {"finish_reason": STOP}


def test_report_only_once_per_request(book):
    book.start("once", DL, 0.0)
    book.on_output(_meta("once", [0.1], completion_tokens=1, finish=STOP))
    again = _meta("once", [0.2], completion_tokens=2, finish=STOP)
    book.on_output(again)  # the request is no longer live
    assert REPORT_KEY not in again
    assert _count(book, "deadline", "attained") == 1


# --- finishing ------------------------------------------------------------------------------------


def test_deadline_missed_counts_as_missed(book):
    book.start("late", DL, 10.0)
    meta = _meta("late", [10.5, 11.2], completion_tokens=2, finish=STOP)
    book.on_output(meta)
    assert meta[REPORT_KEY]["attained"]["deadline"] is False
    assert _count(book, "deadline", "missed") == 1
    assert _count(book, "deadline", "attained") == 0


def test_abort_finish_reason_is_dropped(book):
    book.start("a", LAT, 0.0)
    meta = _meta("a", [0.05], completion_tokens=1, finish=ABORT)
    book.on_output(meta)
    assert meta[REPORT_KEY]["attained"]["overall"] is False
    assert _count(book, "latency", "dropped") == 1
    assert _count(book, "latency", "attained") == 0


def test_on_abort_records_dropped_with_wall_clock_end(book, frozen_now):
    book.start("q", DL, 50.0)
    book.on_output(_meta("q", [50.1], completion_tokens=1))
    frozen_now["t"] = 50.4
    report = book.on_abort("q")
    assert report is not None
    assert report["e2e_ms"] == pytest.approx(400.0, abs=1e-3)  # measured to "now", not the last token
    assert report["output_tokens"] == 1
    assert report["attained"]["deadline"] is False  # dropped before its deadline still misses it
    assert report["attained"]["overall"] is False
    assert _count(book, "deadline", "dropped") == 1
    assert book.report("q") == report
    assert book.metrics.attainment()["deadline"] == {
        "attained": 0,
        "missed": 0,
        "dropped": 1,
        "total": 1,
        "attainment": 0.0,
    }
    assert book.on_abort("q") is None  # already finished
    assert _count(book, "deadline", "dropped") == 1


def test_on_abort_unknown_rid(book):
    assert book.on_abort("nobody") is None
    assert book.metrics.attainment() == {}


def test_finished_without_tokens_uses_wall_clock(book, frozen_now):
    book.start("empty", SloSpec(), 1.0)
    frozen_now["t"] = 3.0
    meta = _meta("empty", None, completion_tokens=0, finish=STOP)
    book.on_output(meta)
    assert meta[REPORT_KEY]["e2e_ms"] == pytest.approx(2000.0)
    assert meta[REPORT_KEY]["attained"]["overall"] is True  # best-effort, finished
    assert _count(book, "best_effort", "attained") == 1


# --- compound programs ----------------------------------------------------------------------------


def _stage(stage):
    return SloSpec(deadline_ms=1000.0, program_id="prog", stage=stage, slo_class=SloClass.COMPOUND)


def test_compound_deadline_from_program_first_arrival(book):
    book.start("s0", _stage(0), 0.0)
    first = _meta("s0", [0.2, 0.5], completion_tokens=2, finish=STOP)
    book.on_output(first)
    assert first[REPORT_KEY]["attained"]["deadline"] is True
    # stage 1 arrives at 0.6 and ends at 1.2: 0.6 s after its own arrival (within 1 s), but
    # 1.2 s after the program's first arrival, so the program deadline is missed.
    book.start("s1", _stage(1), 0.6)
    second = _meta("s1", [0.8, 1.2], completion_tokens=2, finish=STOP)
    book.on_output(second)
    assert second[REPORT_KEY]["attained"]["deadline"] is False
    assert second[REPORT_KEY]["e2e_ms"] == pytest.approx(600.0, abs=1e-3)  # e2e still from its own arrival
    assert _count(book, "compound", "attained") == 1
    assert _count(book, "compound", "missed") == 1


def test_compound_stage_within_program_deadline(book):
    book.start("s0", _stage(0), 0.0)
    book.start("s1", _stage(1), 0.3)
    meta = _meta("s1", [0.5, 0.95], completion_tokens=2, finish=STOP)
    book.on_output(meta)
    assert meta[REPORT_KEY]["attained"]["deadline"] is True


def test_programs_are_separate(book):
    book.start("a0", _stage(0), 0.0)
    other = SloSpec(deadline_ms=1000.0, program_id="other", slo_class=SloClass.COMPOUND)
    book.start("b0", other, 5.0)
    meta = _meta("b0", [5.5], completion_tokens=1, finish=STOP)
    book.on_output(meta)
    assert meta[REPORT_KEY]["attained"]["deadline"] is True  # not measured from program "prog"


# --- report lookup --------------------------------------------------------------------------------


def test_report_lookup_and_retention_limit():
    book = SloReportBook(SloMetrics(), keep_reports=2)
    for i, rid in enumerate(["r1", "r2", "r3"]):
        book.start(rid, DL, float(i))
        book.on_output(_meta(rid, [i + 0.1], completion_tokens=1, finish=STOP))
    assert book.report("r1") is None  # oldest evicted
    assert book.report("r2")["output_tokens"] == 1
    assert book.report("r3")["spec"] == DL.to_dict()
    assert book.report("missing") is None
    assert _count(book, "deadline", "attained") == 3  # eviction does not touch the counters


# --- metrics --------------------------------------------------------------------------------------


def test_metrics_counters_and_attainment(book):
    # latency: one attained, one missed; best effort: one attained
    book.start("ok", LAT, 0.0)
    book.on_output(_meta("ok", [0.05, 0.1], completion_tokens=2, finish=STOP))
    book.start("bad", LAT, 0.0)
    book.on_output(_meta("bad", [0.2, 0.3, 0.31], completion_tokens=3, finish=STOP))
    book.start("be", SloSpec(), 0.0)
    book.on_output(_meta("be", [1.0] * 5, completion_tokens=5, finish=STOP))

    m = book.metrics
    assert _count(book, "latency", "attained") == 1
    assert _count(book, "latency", "missed") == 1
    assert _count(book, "best_effort", "attained") == 1
    assert m.registry.get_sample_value("sglang_slo_output_tokens_total", {"slo_class": "latency"}) == 5
    assert m.registry.get_sample_value("sglang_slo_output_tokens_total", {"slo_class": "best_effort"}) == 5
    # DSLO goodput: "ok" 2 on time; "bad" due 100/110/120 ms, all late -> 0; best-effort all 5
    assert m.registry.get_sample_value("sglang_slo_goodput_tokens_total", {"slo_class": "latency"}) == 2
    assert m.registry.get_sample_value("sglang_slo_goodput_tokens_total", {"slo_class": "best_effort"}) == 5
    assert m.registry.get_sample_value("sglang_slo_ttft_seconds_count", {"slo_class": "latency"}) == 2

    att = m.attainment()
    assert list(att) == ["best_effort", "latency"]  # sorted by class
    assert att["latency"] == {"attained": 1, "missed": 1, "dropped": 0, "total": 2, "attainment": 0.5}
    assert att["best_effort"]["attainment"] == 1.0


def test_ttft_histogram_skips_requests_without_tokens(book):
    book.on_abort("none")  # unknown: ignored
    book.start("x", DL, 0.0)
    book.on_abort("x")
    # no first token, so no TTFT observation (the labelled child is never created)
    assert book.metrics.registry.get_sample_value("sglang_slo_ttft_seconds_count", {"slo_class": "deadline"}) is None
    assert _count(book, "deadline", "dropped") == 1


def test_exposition_contains_metric_names(book):
    book.start("e", LAT, 0.0)
    book.on_output(_meta("e", [0.05], completion_tokens=1, finish=STOP))
    text = book.metrics.exposition().decode()
    for name in (
        "sglang_slo_requests_total",
        "sglang_slo_output_tokens_total",
        "sglang_slo_goodput_tokens_total",
        "sglang_slo_ttft_seconds_bucket",
    ):
        assert name in text
    assert 'sglang_slo_requests_total{result="attained",slo_class="latency"} 1.0' in text


def test_separate_metrics_instances_do_not_share_state():
    a, b = SloMetrics(), SloMetrics()
    book = SloReportBook(a)
    book.start("r", DL, 0.0)
    book.on_abort("r")
    assert a.attainment()["deadline"]["dropped"] == 1
    assert b.attainment() == {}
    assert b"sglang_slo_requests_total{" not in b.exposition()
