"""Perf models: roofline fit recovers known coefficients, table interpolation, inverse
consistency, online updates converge, profile JSON round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.perf_model import (
    PROFILE_FORMAT,
    RooflinePerfModel,
    RooflineTerm,
    Sample,
    TablePerfModel,
    load_perf_model,
    load_profile,
    save_profile,
    spec_steps,
)

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
