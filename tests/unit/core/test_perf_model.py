"""Perf models: roofline fit recovers known coefficients, table interpolation, inverse
consistency for every member of the family, online updates converge, profile JSON round trip,
the one-term rooflines (linear, constant, default)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.pacing import SlowedPerfModel
from scheduler.core.perf_model import (
    DEFAULT_COEFFICIENTS,
    PROFILE_FORMAT,
    RooflinePerfModel,
    RooflineTerm,
    Sample,
    StepTimeModel,
    TablePerfModel,
    constant_model,
    default_model,
    largest_fitting,
    linear_model,
    load_perf_model,
    load_profile,
    prefill_step_times,
    profile_path,
    save_profile,
)
from scheduler.core.roofline import _features, _prune_terms
from scheduler.core.speculation_cost import SpecCost
from scheduler.core.step_time import spec_steps

# memory-bound term (weights read once) and compute-bound term (per-token FLOPs)
TRUE = [
    RooflineTerm(k_tokens=1e-5, k_spec=0.0, k_kv=5e-8, b=8e-3),
    RooflineTerm(k_tokens=5e-5, k_spec=0.0, k_kv=5e-8, b=1e-3),
]


def synthetic_samples(noise: float = 0.0, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    model = RooflinePerfModel(TRUE)
    out = []
    for _ in range(300):
        p = int(rng.choice([0, 0, 64, 256, 1024, 4096]))
        d = int(rng.integers(1, 256))
        kv = int(d * rng.integers(100, 4000))
        t = model.step_time(p, d, kv) * (1 + noise * rng.standard_normal())
        out.append(Sample(p, d, kv, 0, t))
    return out


def test_roofline_fit_recovers_known_coefficients():
    fitted = RooflinePerfModel.fit(synthetic_samples())
    terms = sorted(fitted.terms, key=lambda t: t.k_tokens)
    assert len(terms) == 2
    for got, want in zip(terms, TRUE, strict=True):
        assert got.k_tokens == pytest.approx(want.k_tokens, rel=1e-3)
        assert got.k_kv == pytest.approx(want.k_kv, rel=1e-3)
        assert got.b == pytest.approx(want.b, rel=1e-3)
        assert got.k_spec == 0.0


def test_roofline_fit_tolerates_noise():
    fitted = RooflinePerfModel.fit(synthetic_samples(noise=0.02, seed=1))
    truth = RooflinePerfModel(TRUE)
    for p, d, kv in [(0, 1, 1000), (0, 64, 64 * 2000), (2048, 16, 16000), (4096, 0, 4096)]:
        assert fitted.step_time(p, d, kv) == pytest.approx(truth.step_time(p, d, kv), rel=0.05)


def test_roofline_spec_term_is_the_draft_step_count():
    model = RooflinePerfModel([RooflineTerm(0.0, 1e-3, 0.0, 0.0)])
    assert spec_steps(4, 12) == 3
    assert model.step_time(0, 4, 0, spec_tokens=12) == pytest.approx(3e-3)


def test_roofline_rejects_too_few_samples():
    with pytest.raises(ValueError):
        RooflinePerfModel.fit(synthetic_samples()[:3])


def test_roofline_observe_converges_at_a_point():
    model = RooflinePerfModel(TRUE)
    point = (512, 32, 32 * 1000, 0)
    target = 2.5 * model.step_time(*point)
    errors = []
    for _ in range(30):
        model.observe(*point, target)
        errors.append(abs(model.step_time(*point) - target))
    assert errors[-1] < 1e-6 * target
    assert all(b <= a + 1e-15 for a, b in zip(errors, errors[1:], strict=False))


def test_roofline_observe_learns_a_slower_gpu_over_many_points():
    truth = RooflinePerfModel([RooflineTerm(t.k_tokens * 1.5, 0.0, t.k_kv * 1.5, t.b * 1.5) for t in TRUE])
    model = RooflinePerfModel(TRUE)
    rng = np.random.default_rng(3)
    points = [
        (int(rng.choice([0, 256, 2048])), int(rng.integers(1, 128)), int(rng.integers(1000, 200000)), 0)
        for _ in range(40)
    ]

    def mean_rel_err():
        return np.mean([abs(model.step_time(*p) / truth.step_time(*p) - 1) for p in points])

    before = mean_rel_err()
    for _ in range(20):
        for p in points:
            model.observe(*p, truth.step_time(*p))
    assert mean_rel_err() < 0.05 < before


GRID_B = [1, 8, 64, 512]
GRID_K = [0, 1000, 100000]


def linear_table() -> TablePerfModel:
    times = [[0.005 + 2e-5 * b + 4e-8 * k for k in GRID_K] for b in GRID_B]
    return TablePerfModel(GRID_B, GRID_K, times)


@given(b=st.integers(1, 2000), k=st.integers(0, 300000))
def test_table_reproduces_a_linear_surface_inside_and_beyond_the_grid(b, k):
    assert linear_table().step_time(b, 0, k) == pytest.approx(0.005 + 2e-5 * b + 4e-8 * k, rel=1e-9)


def test_table_sums_prefill_decode_and_spec_tokens():
    table = linear_table()
    assert table.step_time(100, 20, 5000, spec_tokens=8) == pytest.approx(table.step_time(0, 128, 5000))
    assert table.step_time(0, 0, 5000) == 0.0


def test_table_rejects_bad_axes():
    with pytest.raises(ValueError):
        TablePerfModel([1, 1], [0], [[1.0], [2.0]])
    with pytest.raises(ValueError):
        TablePerfModel([1, 2], [0], [[1.0]])


def test_table_observe_converges_and_stays_local():
    table = linear_table()
    far = table.step_time(1, 0, 0)
    point = (0, 100, 5000, 0)
    target = 0.2
    for _ in range(40):
        table.observe(*point, target)
    assert table.step_time(*point) == pytest.approx(target, rel=1e-6)
    assert table.step_time(1, 0, 0) == pytest.approx(far)


MODELS = [RooflinePerfModel(TRUE), linear_table()]


@settings(max_examples=60, deadline=None)
@given(
    which=st.sampled_from([0, 1]),
    budget=st.floats(min_value=0.001, max_value=0.5),
    kv_per_req=st.floats(min_value=0.0, max_value=8000.0),
    prefill=st.sampled_from([0, 128, 1024]),
)
def test_inverse_is_consistent_with_forward(which, budget, kv_per_req, prefill):
    model = MODELS[which]
    n = model.max_batch_within(budget, kv_per_req, prefill_tokens=prefill, limit=4096)

    def t(m):
        return model.step_time(prefill, m, int(round(m * kv_per_req)))

    if n == 0:
        assert t(1) > budget
    else:
        assert t(n) <= budget
        assert n == 4096 or t(n + 1) > budget


def test_inverse_respects_limit():
    assert linear_table().max_batch_within(10.0, 10, limit=37) == 37
    assert linear_table().max_batch_within(1e-6, 10) == 0


def test_profile_round_trip_and_fit_from_samples(tmp_path):
    samples = synthetic_samples()
    profile = {
        "gpu": "test",
        "model": "toy",
        "table": linear_table().to_dict(),
        "samples": [s.__dict__ for s in samples],
    }
    path = tmp_path / "toy.json"
    save_profile(profile, path)
    loaded = load_profile(path)
    assert loaded["format"] == PROFILE_FORMAT
    table = load_perf_model(path, "table")
    assert table.step_time(0, 100, 5000) == pytest.approx(linear_table().step_time(0, 100, 5000))
    roof = load_perf_model(loaded, "roofline")  # no terms stored: fitted from samples
    assert roof.step_time(0, 64, 64000) == pytest.approx(RooflinePerfModel(TRUE).step_time(0, 64, 64000), rel=1e-3)
    again = RooflinePerfModel.from_dict(roof.to_dict())
    assert again.step_time(300, 5, 7000) == pytest.approx(roof.step_time(300, 5, 7000))
    with pytest.raises(ValueError):
        load_perf_model(loaded, "nope")


def test_load_profile_rejects_other_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ValueError):
        load_profile(path)


# ---------------------------------------------------------------- the whole family, one protocol


def _family() -> dict[str, StepTimeModel]:
    table = load_perf_model(profile_path("h100"), kind="table")
    return {
        "roofline": RooflinePerfModel(TRUE),
        "table": linear_table(),
        "h100_table": table,
        "linear": linear_model(
            base_s=0.004, per_token_s=3e-5, per_seq_s=5e-5, per_kv_token_s=1e-8, per_spec_step_s=2e-4
        ),
        "constant": constant_model(0.015),
        "default": default_model(),
        "online_learning": OnlinePerfModel(),
        "online_profiled": OnlinePerfModel(prior=RooflinePerfModel(TRUE)),
        "slowed": SlowedPerfModel(table, 3.0),
        "at_steps": SpecCost(RooflinePerfModel(TRUE), 0.25).at_steps(3),
    }


FAMILY = _family()


def test_every_member_derives_the_inverses_from_one_base() -> None:
    for name, model in FAMILY.items():
        assert isinstance(model, StepTimeModel), name
        assert model.step_time(0, 0, 5000) == 0.0, f"{name}: an empty batch is no forward pass"
        assert model.step_time(1, 0, 0) > 0.0, name


def _assert_largest_within(t: Callable[[int], float], n: int, budget: float, limit: int) -> None:
    """`n` is the largest size in [0, limit] whose step time `t` fits `budget`."""
    assert 0 <= n <= limit
    if n == 0:
        assert t(1) > budget
    else:
        assert t(n) <= budget
        assert n == limit or t(n + 1) > budget


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(FAMILY)),
    budget=st.floats(min_value=1e-4, max_value=2.0),
    kv_per_req=st.floats(min_value=0.0, max_value=8000.0),
    prefill=st.sampled_from([0, 128, 1024]),
    spec_per_req=st.sampled_from([0, 2]),
    extra_kv=st.sampled_from([0, 5000]),
    limit=st.sampled_from([1, 37, 4096]),
)
def test_batch_inverse_is_consistent_with_each_members_step_time(
    name: str, budget: float, kv_per_req: float, prefill: int, spec_per_req: int, extra_kv: int, limit: int
) -> None:
    model = FAMILY[name]
    n = model.max_batch_within(budget, kv_per_req, prefill, spec_per_req, extra_kv, limit)

    def t(m: int) -> float:
        return model.step_time(prefill, m, int(round(m * kv_per_req)) + extra_kv, m * spec_per_req)

    _assert_largest_within(t, n, budget, limit)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(FAMILY)),
    budget=st.floats(min_value=1e-4, max_value=2.0),
    decodes=st.integers(0, 64),
    kv=st.integers(0, 200_000),
    limit=st.sampled_from([1, 512, 8192]),
)
def test_chunk_inverse_is_consistent_with_each_members_step_time(
    name: str, budget: float, decodes: int, kv: int, limit: int
) -> None:
    model = FAMILY[name]
    chunk = model.max_chunk_within(budget, decodes, kv, limit)

    def t(c: int) -> float:
        return model.step_time(c, decodes, kv + c)  # the chunk attends itself too

    _assert_largest_within(t, chunk, budget, limit)

    tokens = model.max_prefill_within(budget, decodes, kv, 0, limit)
    _assert_largest_within(lambda p: model.step_time(p, decodes, kv), tokens, budget, limit)


def test_slowed_and_online_members_answer_like_the_model_they_wrap() -> None:
    base = RooflinePerfModel(TRUE)
    online = OnlinePerfModel(prior=base)
    for budget in (0.01, 0.05, 0.2):
        assert online.max_batch_within(budget, 1000) == base.max_batch_within(budget, 1000)
        assert online.max_chunk_within(budget, 8, 8000, 8192) == base.max_chunk_within(budget, 8, 8000, 8192)
    slowed = SlowedPerfModel(base, 2.0)  # times double exactly: the inverses of half the budget
    for budget in (0.02, 0.1, 0.4):
        assert slowed.max_batch_within(budget, 1000) == base.max_batch_within(budget / 2.0, 1000)
        assert slowed.max_chunk_within(budget, 8, 8000, 8192) == base.max_chunk_within(budget / 2.0, 8, 8000, 8192)


# ---------------------------------------------------------------- one-term rooflines


@given(
    prefill=st.integers(0, 8192),
    decodes=st.integers(0, 512),
    kv=st.integers(0, 2_000_000),
    spec=st.integers(0, 2048),
    coefficients=st.tuples(
        st.sampled_from([0.0, 0.002, 0.008]),
        st.sampled_from([1e-5, 6e-5]),
        st.sampled_from([0.0, 9e-5]),
        st.sampled_from([0.0, 2e-8]),
        st.sampled_from([0.0, 1e-3]),
    ),
)
def test_linear_model_is_its_closed_form(prefill, decodes, kv, spec, coefficients) -> None:
    base, per_token, per_seq, per_kv, per_step = coefficients
    model = linear_model(base, per_token, per_seq, per_kv, per_step)
    if prefill + decodes + spec == 0:
        assert model.step_time(prefill, decodes, kv, spec) == 0.0
        return
    # an affine step time with a per-request decode cost (per_token + per_seq per decode)
    closed = (
        base
        + per_token * prefill
        + (per_token + per_seq) * decodes
        + per_kv * kv
        + per_token * spec
        + per_step * spec_steps(decodes, spec)
    )
    assert model.step_time(prefill, decodes, kv, spec) == pytest.approx(closed, rel=1e-12, abs=1e-15)
    if per_seq == 0.0 and per_step == 0.0:
        # tokens-only: the sum is formed exactly as base + per_token·tokens + per_kv·kv
        tokens = prefill + decodes + spec
        assert model.step_time(prefill, decodes, kv, spec) == base + per_token * tokens + per_kv * kv


@given(prefill=st.integers(0, 8192), decodes=st.integers(0, 512), kv=st.integers(0, 2_000_000), spec=st.integers(0, 64))
def test_constant_model_is_exactly_its_constant_for_any_batch(prefill, decodes, kv, spec) -> None:
    step = 1.0 / 64
    expected = step if prefill + decodes + spec > 0 else 0.0
    assert constant_model(step).step_time(prefill, decodes, kv, spec) == expected


def test_default_model_is_the_named_coefficients_and_never_shared() -> None:
    a, b = default_model(), default_model()
    assert a is not b  # a model may learn online: each caller gets its own
    assert a.terms == DEFAULT_COEFFICIENTS.model().terms
    assert a.step_time(0, 1, 0) == pytest.approx(DEFAULT_COEFFICIENTS.base_s + 1.5e-4)


def test_a_term_that_overshoots_the_data_is_pruned_from_a_fit() -> None:
    """Decode-only iterations (tokens = sequences = KV/100) make every support an exact fit;
    rounding noise can then leave a second term fitted to the one-request samples alone, which
    the max picks for every larger batch. The fit keeps only terms the data needs."""
    samples = [(d, 0.02 + 0.002 * d) for d in range(1, 17)]
    x = np.stack([_features(0, d, 100 * d, 0) for d, _ in samples])
    y = np.array([t for _, t in samples])
    line = np.array([0.002, 0.0, 0.0, 0.02, 0.0])
    overshoot = np.array([0.022, 0.0, 0.0, 0.0, 0.0])  # exact at one request, 5x high at 8
    kept = _prune_terms([line, overshoot], x, y, 1.0 / y**2)
    assert len(kept) == 1 and np.allclose(kept[0], line)
    model = RooflinePerfModel([RooflineTerm(*row) for row in kept])
    assert model.step_time(0, 8, 800) == pytest.approx(0.036)


def _terms(draw_floats: list[float]) -> list[RooflineTerm]:
    return [RooflineTerm(*draw_floats[i : i + 5]) for i in range(0, len(draw_floats), 5)]


@settings(max_examples=300, deadline=None)
@given(
    coefficients=st.lists(st.floats(0.0, 1e-3), min_size=5, max_size=15).filter(lambda c: len(c) % 5 == 0),
    budget=st.floats(-0.01, 0.5),
    kv_per_req=st.floats(0.0, 5000.0),
    prefill=st.integers(0, 4096),
    spec=st.integers(0, 4),
    extra=st.integers(0, 100_000),
    limit=st.integers(0, 1024),
)
def test_a_rooflines_largest_batch_and_chunk_are_the_searched_ones(
    coefficients: list[float], budget: float, kv_per_req: float, prefill: int, spec: int, extra: int, limit: int
) -> None:
    """The roofline solves each term's line for the largest batch or chunk and checks the
    boundary with step_time: the answers are the bisection's, exactly."""
    model = RooflinePerfModel(_terms(coefficients))

    def batch_fits(n: int) -> bool:
        kv = int(round(n * kv_per_req)) + extra
        return model.step_time(prefill, n, kv, n * spec) <= budget

    decodes, kv = spec * 7, extra

    def chunk_fits(c: int) -> bool:
        return model.step_time(c, decodes, kv + c) <= budget

    assert model.max_batch_within(budget, kv_per_req, prefill, spec, extra, limit) == largest_fitting(batch_fits, limit)
    assert model.max_chunk_within(budget, decodes, kv, limit * 8) == largest_fitting(chunk_fits, limit * 8)
    spec_tokens = decodes * spec

    def prefill_fits(p: int) -> bool:  # the KV count stays put: SLOs-Serve's budget beside decodes
        return model.step_time(p, decodes, kv, spec_tokens) <= budget

    assert model.max_prefill_within(budget, decodes, kv, spec_tokens, limit * 8) == largest_fitting(
        prefill_fits, limit * 8
    )


def test_the_solved_batch_is_checked_where_the_kv_count_rounds() -> None:
    """A batch's KV tokens are rounded to whole tokens, so the solved line can be one short:
    the answer is walked to where step_time says the boundary is."""
    model = RooflinePerfModel([RooflineTerm(k_tokens=0.0, k_spec=0.0, k_kv=1.0, b=0.0)])
    # n = 2 attends round(1.2) = 1 token and fits a budget of 1 s; the line alone says n <= 1.67
    assert model.max_batch_within(1.0, 0.6) == 2


@settings(max_examples=60)
@given(
    terms=st.lists(
        st.tuples(*[st.floats(0.0, 0.05, allow_subnormal=False)] + [st.floats(0.0, 1e-4, allow_subnormal=False)] * 4),
        min_size=1,
        max_size=3,
    ),
    decodes=st.integers(0, 300),
    kv=st.integers(0, 2_000_000),
)
def test_prefill_step_times_are_step_time_bit_for_bit(terms, decodes: int, kv: int) -> None:
    """The batch-lever path asks for hundreds of chunk sizes at once: the array answer must be
    the one step_time gives, or a plan would change with the queue's depth."""
    model = RooflinePerfModel(
        [RooflineTerm(b=b, k_tokens=kt, k_spec=ks, k_kv=kk, k_seqs=kq) for b, kt, ks, kk, kq in terms]
    )
    chunks = np.array([0, 1, 7, 64, 513, 8192], dtype=np.int64)
    one_by_one = [model.step_time(int(c), decodes, kv) for c in chunks]
    assert prefill_step_times(model, chunks, decodes, kv).tolist() == one_by_one
    assert prefill_step_times(OnlinePerfModel(prior=model), chunks, decodes, kv).tolist() == one_by_one
    without = constant_model(0.01)  # a model with no array form: one call per size
    assert prefill_step_times(without, chunks, decodes, kv).tolist() == [
        without.step_time(int(c), decodes, kv) for c in chunks
    ]
