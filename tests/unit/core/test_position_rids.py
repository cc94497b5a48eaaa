"""PositionRids: a tier given as positions behaves as the set of its rids, and answers whether
it is empty without building that set."""

from __future__ import annotations

import pickle

import numpy as np

from scheduler.core.position_rids import PositionRids

RIDS = np.array(["a", "b", "c", "b", "d"], dtype=object)


def _at(*positions: int) -> PositionRids:
    return PositionRids(RIDS, np.array(positions, dtype=np.int64))


def test_it_is_the_set_of_the_rids_at_its_positions() -> None:
    tier = _at(1, 2, 3)  # "b" at two positions counts once
    assert tier == {"b", "c"} and {"b", "c"} == tier and len(tier) == 2
    assert "c" in tier and "a" not in tier
    assert sorted(tier) == ["b", "c"]
    assert tier - {"c"} == frozenset({"b"}) and {"a", "b"} - tier == frozenset({"a"})
    assert tier & {"b", "z"} == frozenset({"b"}) and tier | {"z"} == frozenset({"b", "c", "z"})
    assert tier == _at(2, 1) and hash(tier) == hash(frozenset({"b", "c"}))


def test_emptiness_is_read_off_the_positions() -> None:
    empty, one = _at(), _at(4)
    assert not empty and one
    assert empty._rids is None and one._rids is None  # no set built to answer it
    assert empty == frozenset() and one == {"d"}


def test_it_travels_to_other_ranks_as_the_plain_set() -> None:
    sent = pickle.loads(pickle.dumps(_at(0, 4)))
    assert type(sent) is frozenset and sent == {"a", "d"}
