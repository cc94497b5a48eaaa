"""Tempo (one A100, its 3:1:1 latency/deadline/compound mix on Azure conversation lengths,
Poisson load sweep): service gain and goodput over vLLM-FCFS, throughput against Sarathi-Serve,
and the distance to Tempo with the true lengths."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.experiments.headline_grid import Config, Grid, workload_spec
from benchmarks.experiments.headline_report import Experiment, Row, best_of, ratio_text, value_range
from benchmarks.simulator.runner import slo_scale


def tempo(grid: Grid, seeds: Sequence[int], quick: bool) -> Experiment:
    units, rates = (500, [6.0, 10.0]) if quick else (2000, [5.0, 6.5, 8.0, 10.0, 12.0])
    policies = ["fcfs", "sarathi", "las", "sjf", "edf", "tempo", "tempo_oracle"]
    scale = slo_scale()
    for seed in seeds:
        spec = workload_spec("azure-conv", "tempo", units, seed)
        for rate in rates:
            for p in policies:
                # The paper's Tempo maximises service gain (Eq. 1, token-weighted); the server's
                # default objective is request-level.
                params = (("objective", "tokens"),) if p.startswith("tempo") else ()
                grid.run(Config(p, "a100:1", policy=p, policy_params=params), spec, rate, scale)

    def mean(p: str, rate: float, metric: str) -> float:
        return grid.mean(p, "tempo", rate, seeds, metric)

    gain = {r: mean("tempo", r, "service_gain") / max(mean("fcfs", r, "service_gain"), 1e-9) for r in rates}
    good = {r: mean("tempo", r, "goodput_rps") / max(mean("fcfs", r, "goodput_rps"), 1e-9) for r in rates}
    top = max(rates)
    tput = mean("tempo", top, "throughput_tok_s") / max(mean("sarathi", top, "throughput_tok_s"), 1e-9)
    oracle = {r: mean("tempo", r, "goodput_rps") / max(mean("tempo_oracle", r, "goodput_rps"), 1e-9) for r in rates}
    why_gain = (
        "one A100 and Azure chat lengths for the paper's A100s and chatbot/LC mixes; runs of "
        f"{units} arrivals, not an hour, so the cascading HOL blocking the paper's ratios grow from has "
        "less time to build (past capacity the ratio grows with the run's length); Tempo's lengths "
        "are the server's trained length bound (an upper quantile), not the paper's predictor"
    )
    exp = Experiment()
    exp.rows = [
        Row(
            "Tempo",
            "service gain vs vLLM-FCFS (up to)",
            "8.3×",
            best_of(gain),
            ratio_text(max(gain.values()), 8.3),
            why_gain,
        ),
        Row(
            "Tempo",
            "SLO goodput vs vLLM-FCFS (up to)",
            "10.3×",
            best_of(good),
            ratio_text(max(good.values()), 10.3),
            why_gain,
        ),
        Row(
            "Tempo",
            "throughput vs Sarathi-Serve",
            "96–98 %",
            f"{100 * tput:.0f} % (at {top:g}/s, over the makespan)",
            ratio_text(tput, 0.97),
            "the same engine speed model for both; Tempo's preemptions and reordering cost recomputation only",
        ),
        Row(
            "Tempo",
            "Tempo / its precise-knowledge oracle (goodput)",
            "close to 1",
            value_range(list(oracle.values())),
            "-",
            "the oracle maximises Tempo's objective, service gain (where it leads), not request goodput: "
            "knowing compound stages are short, it ranks them lower by density",
        ),
    ]
    exp.details = {
        "service_gain_x_fcfs": gain,
        "goodput_x_fcfs": good,
        "throughput_x_sarathi": tput,
        "x_oracle": oracle,
        "rates": rates,
        "policies": policies,
    }
    return exp
