"""Stage sub-deadlines for compound programs (JITServe §4.1, Tempo super-nodes).

A program's end-to-end deadline D is amortised over its stages: stage s must finish by
arrival + φ(s)·D, where φ is the accumulated time share of the most similar finished program.
Finished calls build the running program's partial graph; programs idle for `idle_s` with no
call in flight are complete and join the pattern library, so the server learns its own
workloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.analyzer.graph import PatternGraph, PatternLibrary, StageCost, SuperNode

EXPIRE_EVERY_STEPS = 256  # engine steps between `expire` calls (the adapter's and the simulator's cadence)
STUCK_IDLE_FACTOR = 10  # a program with calls in flight closes after this many idle_s anyway


@dataclass
class _Program:
    last_seen: float
    stage_order: list[int | str] = field(default_factory=list)  # stage keys, first appearance
    calls: dict[int | str, list[tuple[float, float]]] = field(default_factory=dict)  # finished calls
    deadlines: dict[int, float | None] = field(default_factory=dict)  # stage index -> absolute
    in_flight: int = 0  # calls seen arriving and not yet finished

    def index(self, key: int | str) -> int:
        if key not in self.stage_order:
            self.stage_order.append(key)
        return self.stage_order.index(key)

    def completed_graph(self, before: int, cost: StageCost) -> PatternGraph:
        stages = [self.calls[k] for k in self.stage_order[:before] if self.calls.get(k)]
        return PatternGraph(tuple(SuperNode.from_calls(c, cost) for c in stages))


class CompoundDeadlines:
    def __init__(self, library: PatternLibrary | None = None, idle_s: float = 60.0, cost: StageCost | None = None):
        self.library = library if library is not None else PatternLibrary()
        self.idle_s = idle_s
        self.cost = cost or StageCost()
        self._programs: dict[str, _Program] = {}
        self.matched = 0

    def _program(self, program_id: str, now: float) -> _Program:
        prog = self._programs.get(program_id)
        if prog is None:
            prog = self._programs[program_id] = _Program(last_seen=now)
        prog.last_seen = max(prog.last_seen, now)
        return prog

    def _key(self, prog: _Program, stage: int | str | None) -> int | str:
        """An unnamed stage is the one after all stages that already finished a call."""
        if stage is not None:
            return stage
        done = sum(1 for k in prog.stage_order if prog.calls.get(k))
        return prog.stage_order[done] if done < len(prog.stage_order) else f"auto-{done}"

    def stage_deadline(
        self, program_id: str, stage: int | str | None, program_arrival: float, deadline_s: float, now: float
    ) -> float | None:
        """Absolute sub-deadline of this request's stage, or None without a matching pattern."""
        prog = self._program(program_id, now)
        prog.in_flight += 1
        idx = prog.index(self._key(prog, stage))
        if idx not in prog.deadlines:
            rel = (
                self.library.stage_deadline(prog.completed_graph(idx, self.cost), deadline_s) if self.library else None
            )
            prog.deadlines[idx] = None if rel is None else program_arrival + rel
            self.matched += rel is not None
        return prog.deadlines[idx]

    def on_finish(
        self, program_id: str, stage: int | str | None, input_tokens: int, output_tokens: int, now: float
    ) -> None:
        prog = self._program(program_id, now)
        prog.in_flight = max(0, prog.in_flight - 1)
        key = self._key(prog, stage)
        prog.index(key)
        prog.calls.setdefault(key, []).append((float(input_tokens), float(output_tokens)))

    def expire(self, now: float) -> int:
        """Close programs idle for idle_s with no call in flight; their graphs join the library.
        Returns how many. A call queued longer than idle_s (overload, or an emulated card whose
        idle_s is real time) must not split its program: the closed prefix would join the
        library as a whole program, and the rest would start over at stage 0 with sub-deadlines
        matched on the wrong prefix. A call that never reports back (aborted before its first
        pass) holds its program for STUCK_IDLE_FACTOR·idle_s at most."""
        stuck = STUCK_IDLE_FACTOR * self.idle_s
        done = [
            p
            for p, prog in self._programs.items()
            if now - prog.last_seen > (self.idle_s if prog.in_flight == 0 else stuck)
        ]
        for program_id in done:
            prog = self._programs.pop(program_id)
            graph = prog.completed_graph(len(prog.stage_order), self.cost)
            if len(graph) > 0:
                self.library.add(graph)
        return len(done)

    def __len__(self) -> int:
        return len(self._programs)
