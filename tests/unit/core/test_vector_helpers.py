"""The vector helpers the policies score with agree with one request (or one group) at a time:
GMAX's count of on-time tokens against a walk over the tokens, the group reductions against a
per-group loop, and the row-membership mask against np.isin."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.columns import rows_among
from scheduler.core.estimates import group_reduce
from scheduler.core.remaining_work import latency_on_time_tokens

# Times in eighths of a second: every sum and every integral quotient is exact in binary, so the
# walk's comparisons and the closed form's floor/ceil see the same numbers.
eighths = st.integers(0, 160).map(lambda k: k / 8)
request = st.tuples(
    eighths,  # arrival
    st.one_of(st.just(math.nan), eighths),  # TTFT (nan: none)
    st.integers(0, 6).map(lambda k: k / 8),  # TPOT (0: none)
    st.integers(0, 20),  # generated
    st.integers(0, 30),  # more tokens the bound allows
)


def _on_time_walk(
    arrival: float, ttft: float, tpot: float, g: int, total: int, first_emit: float, decode_s: float
) -> int:
    """Token j (g <= j < total) comes at first_emit + (j - g)·decode_s, due at arrival + ttft + j·tpot."""
    if math.isnan(ttft):
        return total - g
    return sum(first_emit + (j - g) * decode_s <= arrival + ttft + j * tpot for j in range(g, total))


@settings(max_examples=300, deadline=None)
@given(st.lists(request, min_size=1, max_size=12), eighths, st.integers(1, 6).map(lambda k: k / 8))
def test_on_time_tokens_are_the_walks_count(reqs: list[tuple], first_emit: float, decode_s: float) -> None:
    arrival, ttft, tpot, g, more = (np.array(col, dtype=float) for col in zip(*reqs, strict=True))
    a = SimpleNamespace(arrival=arrival, ttft_s=ttft, tpot_s=tpot, generated=g, total_out=g + 1 + more)
    got = latency_on_time_tokens(a, np.full(len(reqs), first_emit), decode_s)  # type: ignore[arg-type]
    want = [_on_time_walk(ar, tt, tp, int(gg), int(gg + 1 + m), first_emit, decode_s) for ar, tt, tp, gg, m in reqs]
    assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.integers(-1, 5)), max_size=30), st.sampled_from(["max", "sum"]))
def test_group_reduce_is_the_per_group_max_or_sum(rows: list[tuple[float, int]], how: str) -> None:
    values = np.array([v for v, _ in rows], dtype=float)
    group = np.array([g for _, g in rows], dtype=np.int64)
    by_group: dict[int, float] = {}
    for v, g in rows:  # in input order, as the engine-side reduction adds
        if g >= 0:
            by_group[g] = v if g not in by_group else (max(by_group[g], v) if how == "max" else by_group[g] + v)
    want = [by_group[g] if g >= 0 else v for v, g in rows]
    assert group_reduce(values, group, how).tolist() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.lists(st.integers(0, 300), max_size=40))
def test_rows_among_is_isin(rows: list[int], among: list[int]) -> None:
    r, a = np.array(rows, dtype=np.int64), np.array(among, dtype=np.int64)
    assert rows_among(r, a).tolist() == np.isin(r, a).tolist()
