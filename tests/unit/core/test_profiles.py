"""The shipped Llama-3-8B profiles: monotone, plausible, and exactly what the builder makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.core.perf_model import RooflinePerfModel, TablePerfModel, load_profile, profile_path

GPUS = ["h100", "a100", "a40"]
DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"


@pytest.mark.parametrize("gpu", GPUS)
def test_table_is_monotone_in_batch_and_kv(gpu):
    times = np.array(load_profile(profile_path(gpu))["table"]["time_s"])
    assert np.all(times > 0)
    assert np.all(np.diff(times, axis=0) >= 0), "time must not fall with more batch tokens"
    assert np.all(np.diff(times, axis=1) >= 0), "time must not fall with more KV tokens"


@pytest.mark.parametrize("gpu", GPUS)
def test_both_models_are_monotone_off_grid(gpu):
    profile = load_profile(profile_path(gpu))
    for model in (TablePerfModel.from_profile(profile), RooflinePerfModel.from_profile(profile)):
        by_batch = [model.step_time(0, b, b * 1500) for b in range(1, 600, 7)]
        by_prefill = [model.step_time(p, 16, 16 * 1000 + p) for p in range(0, 8000, 97)]
        assert all(b >= a for a, b in zip(by_batch, by_batch[1:], strict=False))
        assert all(b >= a for a, b in zip(by_prefill, by_prefill[1:], strict=False))


# (decode batch 1 at 1K context, decode batch 64 at 2K context each, 2048-token prefill), seconds
PLAUSIBLE = {
    "h100": ((0.003, 0.020), (0.006, 0.040), (0.02, 0.12)),
    "a100": ((0.006, 0.025), (0.010, 0.060), (0.05, 0.30)),
    "a40": ((0.015, 0.060), (0.025, 0.150), (0.10, 0.60)),
}


@pytest.mark.parametrize("gpu", GPUS)
def test_times_are_in_a_plausible_range(gpu):
    profile = load_profile(profile_path(gpu))
    (d1_lo, d1_hi), (d64_lo, d64_hi), (p_lo, p_hi) = PLAUSIBLE[gpu]
    for model in (TablePerfModel.from_profile(profile), RooflinePerfModel.from_profile(profile)):
        assert d1_lo <= model.step_time(0, 1, 1024) <= d1_hi
        assert d64_lo <= model.step_time(0, 64, 64 * 2048) <= d64_hi
        assert p_lo <= model.step_time(2048, 0, 2048) <= p_hi
    assert 50_000 < profile["kv_token_capacity"] < 1_000_000


def test_faster_gpus_are_faster():
    tables = {g: TablePerfModel.from_profile(profile_path(g)) for g in GPUS}
    for point in [(0, 1, 1024), (0, 128, 128 * 1024), (4096, 0, 4096)]:
        h, a, a40 = (tables[g].step_time(*point) for g in GPUS)
        assert h < a < a40


def test_roofline_fits_the_profile_samples():
    for gpu in GPUS:
        profile = load_profile(profile_path(gpu))
        model = RooflinePerfModel.from_profile(profile)
        errs = [
            abs(model.step_time(s["prefill_tokens"], s["decode_reqs"], s["kv_tokens"]) / s["time_s"] - 1)
            for s in profile["samples"]
        ]
        assert np.mean(errs) < 0.06
        assert max(errs) < 0.3


@pytest.mark.skipif(not (DATA / "vidur-profiling").exists(), reason="Vidur data not present")
def test_committed_profiles_match_the_builder(tmp_path):
    from scheduler.profiles.build_from_vidur import main

    main(["--data", str(DATA), "--out", str(tmp_path)])
    for gpu in GPUS:
        name = f"{gpu}-llama3-8b.json"
        assert (tmp_path / name).read_text() == profile_path(gpu).read_text(), f"{name} is stale: rebuild it"
