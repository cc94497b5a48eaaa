"""Compound programs: the deadline of every stage runs from the program's first arrival."""

from __future__ import annotations


class ProgramTracker:
    """Remembers when each program_id was first seen; forgets programs idle past `ttl_s`."""

    def __init__(self, ttl_s: float = 3600.0, max_programs: int = 100_000) -> None:
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._ttl_s = ttl_s
        self._max = max_programs

    def arrival(self, program_id: str, request_arrival: float) -> float:
        first = self._first.get(program_id)
        if first is None or request_arrival < first:
            self._first[program_id] = first = request_arrival
        self._last[program_id] = max(self._last.get(program_id, request_arrival), request_arrival)
        if len(self._first) > self._max:
            self.evict(now=max(self._last.values()))
        return first

    def evict(self, now: float) -> None:
        stale = [p for p, t in self._last.items() if now - t > self._ttl_s]
        if len(self._first) - len(stale) > self._max:
            stale = sorted(self._last, key=self._last.__getitem__)[: len(self._first) - self._max // 2]
        for p in stale:
            self._first.pop(p, None)
            self._last.pop(p, None)

    def __len__(self) -> int:
        return len(self._first)
