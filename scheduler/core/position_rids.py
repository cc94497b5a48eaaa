"""A set of rids given as positions in a rid array, hashed only if someone asks by rid.

A policy's best-effort tier can hold most of a deep queue (every lost cause), and the engine that
made the view applies it by position. Building its rid set costs a hash insert per rid on every
pass, so the set is built on the first lookup or iteration instead: the adapter's usual pass
never makes one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from typing import Any

import numpy as np


class PositionRids(Set[str]):
    """The rids at `positions` of `rid_array` (an object array), as a read-only set."""

    __slots__ = ("_rid_array", "positions", "_rids")

    def __init__(self, rid_array: np.ndarray, positions: np.ndarray) -> None:
        self._rid_array = rid_array
        self.positions = positions
        self._rids: frozenset[str] | None = None

    def rids(self) -> frozenset[str]:
        """The set itself, built once."""
        if self._rids is None:
            self._rids = frozenset(self._rid_array[self.positions].tolist())
        return self._rids

    def __contains__(self, rid: object) -> bool:
        return rid in self.rids()

    def __iter__(self) -> Iterator[str]:
        return iter(self.rids())

    def __len__(self) -> int:
        return len(self.rids())

    def __bool__(self) -> bool:  # a position always names a rid: no set needed
        return len(self.positions) > 0

    def __hash__(self) -> int:
        return hash(self.rids())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PositionRids):
            other = other.rids()
        return self.rids() == other

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:  # what Set's operators return
        return frozenset(it)

    def __reduce__(self) -> tuple[Any, ...]:  # sent to other ranks as the plain set
        return frozenset, (tuple(self.rids()),)

    def __repr__(self) -> str:
        return f"PositionRids({sorted(self.rids())!r})"
