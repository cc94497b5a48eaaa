"""Prefix table and the SGLang-router-style cache-aware policy."""

from __future__ import annotations

import pytest

from router.policies.cache_aware import CacheAwareParams, CacheAwarePolicy
from router.policies.prefix_table import PrefixTable
from tests.unit.router._policy_views import request, worker


def test_prefix_table_leading_matches_and_bound() -> None:
    table = PrefixTable(max_blocks_per_worker=4)
    table.record("a", (1, 2, 3))
    table.record("b", (1, 9))
    assert table.matches((1, 2, 3, 4)) == {"a": 3, "b": 1}
    assert table.matches((2, 3)) == {"a": 2}
    assert table.matches((7,)) == {}
    table.record("a", (5, 6))  # evicts the least recently used hash: 1
    assert table.blocks("a") == 4
    assert table.matches((1, 2, 3)) == {"b": 1}
    table.forget("b")
    assert table.matches((1,)) == {}
    with pytest.raises(ValueError):
        PrefixTable(0)


def test_sticks_to_the_worker_holding_the_prefix() -> None:
    policy = CacheAwarePolicy()
    workers = [worker("a", inflight=1), worker("b", inflight=0), worker("c", inflight=3)]
    policy.on_routed(request("warm", prefix_hashes=(10, 11, 12, 13)), "c")
    d = policy.choose(request("r1", prefix_hashes=(10, 11, 12, 99)), workers, now=0.0)
    assert (d.worker_id, d.reason) == ("c", "prefix_match")
    assert d.detail["match_share"] == pytest.approx(0.75)


def test_low_match_share_goes_to_least_loaded_which_then_caches_it() -> None:
    policy = CacheAwarePolicy(CacheAwareParams(cache_threshold=0.5))
    workers = [worker("a", inflight=1), worker("b", inflight=0), worker("c", inflight=3)]
    policy.on_routed(request("warm", prefix_hashes=(10,)), "c")
    d = policy.choose(request("r1", prefix_hashes=(10, 20, 21, 22)), workers, now=0.0)
    assert (d.worker_id, d.reason) == ("b", "least_loaded")
    again = [worker("a", inflight=1), worker("b", inflight=2), worker("c", inflight=3)]
    assert policy.choose(request("r2", prefix_hashes=(10, 20, 21, 22)), again, now=0.0).worker_id == "b"


def test_falls_back_when_the_holder_is_overloaded() -> None:
    policy = CacheAwarePolicy(CacheAwareParams(balance_abs_threshold=8, balance_rel_threshold=1.5))
    policy.on_routed(request("warm", prefix_hashes=(1, 2)), "hot")
    busy = [worker("hot", inflight=20), worker("cold", inflight=4)]
    d = policy.choose(request("r", prefix_hashes=(1, 2)), busy, now=0.0)
    assert (d.worker_id, d.reason) == ("cold", "least_loaded")
    # Within the absolute gap the cache still wins.
    fresh = CacheAwarePolicy(CacheAwareParams(balance_abs_threshold=8, balance_rel_threshold=1.5))
    fresh.on_routed(request("warm", prefix_hashes=(1, 2)), "hot")
    mild = [worker("hot", inflight=10), worker("cold", inflight=4)]
    assert fresh.choose(request("r2", prefix_hashes=(1, 2)), mild, now=0.0).worker_id == "hot"
