"""The plan path's cost per adapter pass: what the SGLang adapter does per scheduling pass with
256 running requests of SGLang's shape (rid, sampling_params with the injected SLO,
origin_input_ids, output_ids, token stamps, prefix length), each running one a token further
every pass, as after a decode step: build the views from them, ask the policy and finish its plan
on the one plan path (with the levers sized by the perf model), and apply it to the waiting queue
(drops split off, the queue sorted, tiers marked). The engine step advances every pass, so
preemption quanta and frames fall where they would. States (plan_path_states.py): the usual mix
at 1 000 and 10 000 waiting, and five states built to be adversarial for some policy, at 1 000
waiting. p50, p99 and max over 200 passes (60 at 10 000) after 3 warm ones, and the passes whose
search ran out of its budget. The plan keeps the card idle while it runs and the worst pass
decides, so the goals are on the tail: p99 <= 1 ms at 1 000 waiting, <= 5 ms at 10 000, and
max <= 2 x p99.

With `repeats` > 1 every cell is run that many times, the runs interleaved (every state and
policy once, then again), and each statistic is the median over the runs, each run's p99 kept
beside it. A slow pass the code makes recurs in every run; a stretch where the shared host was
slow hits one run of a few cells, and one run's tail on such a host moves by more than the
changes it is used to judge. decision_latency.py is the command that runs it.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks.experiments.plan_path_states import RUNNING, PlanState, adversarial_states, sglang_reqs, usual_state
from scheduler.components.plan_applier import held_positions, order_waiting, set_aside
from scheduler.components.planner import PassPlanner
from scheduler.components.request_state import RequestStates
from scheduler.components.views import EngineLimits, ViewBuilder
from scheduler.core.clock import WallClock
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.perf_model import default_model
from scheduler.core.plan_path import LeverModel, settings_for
from scheduler.core.policies import POLICIES, PolicyContext

Cell = dict[str, Any] | str  # a state's row for one policy: its tail, or what went wrong
PLAN_PATH_QUEUED = (1_000, 10_000)
PLAN_PATH_PASSES = {1_000: 200, 10_000: 60}
PLAN_PATH_GOALS_MS = {"10,000": 5.0}  # every other state (1 000 waiting): 1 ms
MAX_OVER_P99 = 2.0


def _passes_ms(
    one_pass: Callable[[int], object], passes: int, between: Callable[[], object], warm: int = 3
) -> tuple[list[float], list[float]]:
    """(wall, CPU) ms of each of `passes` calls of `one_pass(k)` after `warm` untimed ones (a
    server's passes run warm: its first pass builds every row); `between` runs untimed before
    each call. The CPU time is this thread's own: what the pass costs, without the time other
    processes on a busy host take from it, which the wall time includes."""
    wall, cpu = [], []
    for k in range(warm + passes):
        between()
        t0, c0 = time.perf_counter(), time.thread_time()
        one_pass(k)
        t1, c1 = time.perf_counter(), time.thread_time()
        if k >= warm:
            wall.append((t1 - t0) * 1000.0)
            cpu.append((c1 - c0) * 1000.0)
    return wall, cpu


def _tail(samples: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(samples), "p99": float(np.percentile(samples, 99)), "max": max(samples)}


def _state_passes(state: PlanState, name: str, passes: int, clock: WallClock) -> Cell:
    """p50/p99/max ms of `name`'s adapter passes over `state`, and its budget fallbacks."""
    waiting, running_reqs = sglang_reqs(state, clock)
    limits = EngineLimits(RUNNING, 8192, 600_000, 1_000_000, 0)
    states = RequestStates()
    views = ViewBuilder(states, clock, CompoundDeadlines())
    perf = default_model()
    base, _, given = name.partition(":")  # "slos:search_budget_ms=1.0": a policy with parameters
    params = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in given.split(",") if kv)}
    policy = POLICIES.make(base, params, PolicyContext(perf))
    planner = PassPlanner(policy, settings_for(policy))
    levers = LeverModel(perf)
    queue = list(waiting)

    def one_pass(k: int) -> None:
        engine_view = views.engine_view(queue, running_reqs, replace(limits, step=state.step_of(k)))
        plan = planner.plan(engine_view, levers)
        if plan is not None:  # as the adapter applies it, drops aside (the load stays fixed)
            viewed = views.waiting_rids(queue)
            perm = order_waiting(queue, plan, states, viewed)
            views.queue.applied(queue, perm)
            if plan.hold:  # _slo_admit: the held requests wait out the admission walk aside
                at = held_positions(plan, perm, len(queue)) if viewed is not None else None
                held = set_aside(queue, plan.hold, at)
                views.held_to_tail(plan.hold, at, queue, held)
                queue.extend(held)

    def decode_step() -> None:  # every pass, each running request has one more token
        now = clock.now()
        for req in running_reqs:
            req.decode_one(now)

    try:
        gc.collect()  # the policies timed before leave garbage a server running one never has
        wall, cpu = _passes_ms(one_pass, passes, decode_step)
    except Exception as exc:  # report, keep measuring the others
        return f"error: {type(exc).__name__}: {exc}"
    if planner.errors:
        return f"error: {planner.errors} failed plans"
    return {
        **_tail(wall),
        "cpu": _tail(cpu),
        "passes": passes,
        "budget_fallbacks": planner.budget_fallbacks,
    }


def plan_path_states(adversarial: bool = True) -> list[tuple[PlanState, int]]:
    """(state, timed passes): the usual mix at 1 000 and 10 000 waiting, then the adversarial
    states at 1 000 waiting."""
    out = [(usual_state(n), PLAN_PATH_PASSES[n]) for n in PLAN_PATH_QUEUED]
    if adversarial:
        out += [(s, PLAN_PATH_PASSES[1_000]) for s in adversarial_states(1_000)]
    return out


def bench_plan_path(
    states: Sequence[tuple[PlanState, int]] | None = None, policies: Sequence[str] | None = None, repeats: int = 1
) -> dict[str, dict[str, Cell]]:
    """state -> policy -> p50/p99/max ms per adapter pass (views, plan, plan path, applying the
    order), with the passes timed and the budget fallbacks among them; over `repeats` runs, the
    median of each statistic (see the module's docstring)."""
    clock = WallClock()
    chosen = states if states is not None else plan_path_states()
    names = list(policies or list(POLICIES))
    runs: dict[str, dict[str, list[Cell]]] = {state.name: {name: [] for name in names} for state, _ in chosen}
    for _ in range(max(repeats, 1)):
        for state, passes in chosen:
            for name in names:
                runs[state.name][name].append(_state_passes(state, name, passes, clock))
    return {state: {name: _median_run(cells) for name, cells in row.items()} for state, row in runs.items()}


def _median_run(cells: list[Cell]) -> Cell:
    """One run's cell as it is; over several, each statistic's median, each run's p99 kept, the
    budget fallbacks summed. A run that failed stands for them all."""
    failed = [c for c in cells if isinstance(c, str)]
    if failed or len(cells) == 1:
        return failed[0] if failed else cells[0]
    done = [c for c in cells if isinstance(c, dict)]

    def medians(tails: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {key: statistics.median(t[key] for t in tails) for key in ("p50", "p99", "max")}
        return {**out, "p99_runs": [t["p99"] for t in tails]}

    return {
        **medians(done),
        "cpu": medians([c["cpu"] for c in done]),
        "passes": done[0]["passes"],
        "runs": len(done),
        "budget_fallbacks": sum(c["budget_fallbacks"] for c in done),
    }


def plan_path_goal_met(state: str, cell: Cell) -> bool:
    """p99 within the state's goal and max within MAX_OVER_P99 x p99."""
    if isinstance(cell, str):
        return False
    return cell["p99"] <= PLAN_PATH_GOALS_MS.get(state, 1.0) and cell["max"] <= MAX_OVER_P99 * cell["p99"]


def print_plan_path(rows: dict[str, dict[str, Cell]], cpu: bool = False) -> None:
    states = list(rows)
    names = list(dict.fromkeys(n for row in rows.values() for n in row))
    runs = max((c.get("runs", 1) for row in rows.values() for c in row.values() if isinstance(c, dict)), default=1)
    over = f", the median of {runs} runs" if runs > 1 else ""
    print(
        f"{'thread CPU' if cpu else 'wall'} p50 / p99 / max ms per adapter pass, {RUNNING} running{over} "
        "(ok: p99 <= goal and max <= 2 x p99; [n]: budget fallbacks)"
    )
    print(f"{'policy':<14}" + "".join(f"{s:>26}" for s in states))
    for name in names:
        cells = []
        for state in states:
            c = rows[state].get(name, "")
            if cpu and isinstance(c, dict):
                c = {**c, **c["cpu"]}
            if isinstance(c, str):
                cells.append(f"{c[:25]:>26}")
                continue
            flag = "ok" if plan_path_goal_met(state, c) else "!!"
            spent = f"[{c['budget_fallbacks']}]" if c["budget_fallbacks"] else ""
            cells.append(f"{c['p50']:.2f}/{c['p99']:.2f}/{c['max']:.2f} {flag}{spent}".rjust(26))
        print(f"{name:<14}" + "".join(cells))
