"""Train the server's default length table on one part of a public trace and score it on parts it
never saw, against the recent-answers quantile (the previous default) and a constant.

The table (scheduler/core/analyzer/table.py) maps the prompt's length to quantiles of the answer's
length; nothing else about a request is read, and never the answer's own length. Held-back sets:
the head of the training trace by time (`--holdout-head`, the window the simulated benchmarks
replay, so a simulated run never sees its own answers in the table), a forward split (a table
trained on the first part scores the last), and whole other traces (azure-code, Mooncake, the
JITServe deep-research calls) where a chat table is out of its depth. Each history baseline runs
online over the held-back stream in arrival order (it bounds a request, then learns its answer),
warmed with the training part's last answers: its best case, a server that ran before.

Rows: pinball loss at `--quantile` (what a quantile bound minimises), under-estimation rate, MAE
and mean bound, per predictor: `table` (static), `trained` (the server default: table or history,
whichever bounded recent answers better), `history` (the recent-answers quantile), `history-len`
(the same per half-octave prompt band) and `constant` (the training part's quantile).

  python -m benchmarks.predictor.train_length --out scheduler/core/analyzer/tables/azure_conv.json
  python -m benchmarks.predictor.train_length --json /tmp/length_eval.json   # evaluate only
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.cli import doc_parser
from benchmarks.workloads.traces import TraceRequest, load
from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor
from scheduler.core.analyzer.table import LengthTable, fit_table
from scheduler.core.analyzer.trained import COLD_START, TrainedPredictor

CROSS_TRACES = ("azure-code", "mooncake-conversation", "deepresearch")
WARM = 1000  # training answers a history baseline has seen before the held-back stream (its window)


@dataclass(frozen=True)
class Row:
    prompt_len: int
    output_len: int
    app_id: str | None = None


def rows_of(requests: Sequence[TraceRequest], max_output: int | None) -> list[Row]:
    cap = max_output or 10**9
    return [Row(r.prompt_tokens, min(r.output_tokens, cap), r.program_id) for r in requests]


def split_head(rows: Sequence[Row], requests: Sequence[TraceRequest], share: float) -> tuple[list[Row], list[Row]]:
    """(head, rest) by arrival time: the first `share` of the trace's span, and the remainder."""
    t0, t1 = requests[0].arrival_s, requests[-1].arrival_s
    cut = t0 + share * (t1 - t0)
    head = [row for row, r in zip(rows, requests) if r.arrival_s < cut]
    return head, list(rows[len(head) :])


def scores(bounds: Sequence[float], rows: Sequence[Row], q: float) -> dict[str, float]:
    b = np.asarray(bounds, dtype=float)
    y = np.asarray([r.output_len for r in rows], dtype=float)
    loss = np.where(y > b, q * (y - b), (1 - q) * (b - y))
    return {
        "pinball": round(float(loss.mean()), 2),
        "under_rate": round(float((b < y).mean()), 4),
        "mae": round(float(np.abs(b - y).mean()), 1),
        "mean_bound": round(float(b.mean()), 1),
    }


Predict = Callable[[Row], float]
Observe = Callable[[Row], None]


def online(predict: Predict, observe: Observe, stream: Sequence[Row], cap: float) -> list[float]:
    """Bound each request, then learn its answer; no guess (cold start) is the client's cap."""
    out = []
    for row in stream:
        value = predict(row)
        out.append(value if np.isfinite(value) else cap)
        observe(row)
    return out


def history(q: float, by_len: bool, warm: Sequence[Row]) -> tuple[Predict, Observe]:
    h = HistoryPredictor(HistoryParams(quantile=q, default=np.inf, min_global=COLD_START, by_prompt_len=by_len))
    for r in warm[-WARM:]:
        h.observe(r.app_id, r.output_len, r.prompt_len)
    return (lambda r: h.predict("", r.prompt_len, r.app_id)), (
        lambda r: h.observe(r.app_id, r.output_len, r.prompt_len)
    )


def trained(table: LengthTable, q: float, switch: bool) -> tuple[Predict, Observe]:
    """Cold: a server starting on this traffic (its history is its own, not the training trace's)."""
    t = TrainedPredictor(table, q, switch=switch)
    return (lambda r: t.predict("", r.prompt_len, r.app_id)), (
        lambda r: t.observe(r.app_id, r.output_len, r.prompt_len)
    )


def evaluate(table: LengthTable, train: Sequence[Row], test: Sequence[Row], q: float, cap: float) -> dict[str, dict]:
    constant = float(np.quantile([r.output_len for r in train], q))
    out = {
        "table": scores(online(*trained(table, q, False), test, cap), test, q),
        "trained": scores(online(*trained(table, q, True), test, cap), test, q),
        "history": scores(online(*history(q, False, train), test, cap), test, q),
        "history-len": scores(online(*history(q, True, train), test, cap), test, q),
        "history-cold": scores(online(*history(q, False, []), test, cap), test, q),
        "constant": scores([constant] * len(test), test, q),
    }
    return {"rows": len(test), **out}


def main(argv: Sequence[str] | None = None) -> int:
    ap = doc_parser("python -m benchmarks.predictor.train_length", __doc__ or "")
    ap.add_argument("--trace", default="azure-conv", help="the trace the table is trained on")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--holdout-head", type=float, default=0.4, help="share of the trace's span held back")
    ap.add_argument("--quantile", type=float, default=0.9, help="the bound's quantile (the server's default)")
    ap.add_argument("--min-rows", type=int, default=100, help="training rows per table bin at least")
    ap.add_argument("--max-output", type=int, default=None, help="cap answers (as a benchmark's --max-output)")
    ap.add_argument("--cap", type=float, default=2048.0, help="a cold history's bound: the client's cap")
    ap.add_argument("--out", default=None, help="write the table trained on the part not held back here")
    ap.add_argument("--json", default=None, help="write the evaluation here")
    args = ap.parse_args(argv)
    q = args.quantile
    reqs = load(args.trace, args.data_dir).requests
    rows = rows_of(reqs, args.max_output)
    head, rest = split_head(rows, reqs, args.holdout_head)
    meta = {
        "trained_on": f"{args.trace}: arrivals after the first {args.holdout_head:.0%} of its span ({len(rest)} rows)",
        "features": "prompt length only",
        "source": "Azure LLM inference trace 2023 (Azure/AzurePublicDataset), Patel et al., Splitwise, ISCA 2024",
        "license": "CC-BY-4.0 (derived quantiles of the source's token counts; attribution above)",
        "command": (
            f"python -m benchmarks.predictor.train_length --trace {args.trace} --holdout-head {args.holdout_head}"
            f" --quantile {q} --min-rows {args.min_rows}"
            + (f" --max-output {args.max_output}" if args.max_output else "")
            + f" --out {args.out}"
        ),
    }
    table = fit_table([r.prompt_len for r in rest], [r.output_len for r in rest], args.min_rows, meta=meta)
    forward_train, forward_test = split_head(rows, reqs, 1 - args.holdout_head)
    forward_table = fit_table(
        [r.prompt_len for r in forward_train], [r.output_len for r in forward_train], args.min_rows
    )
    report: dict[str, dict] = {
        f"{args.trace} head (held back)": evaluate(table, rest, head, q, args.cap),
        f"{args.trace} forward (table of the first part)": evaluate(
            forward_table, forward_train, forward_test, q, args.cap
        ),
    }
    for name in CROSS_TRACES:
        if name != args.trace:
            other = rows_of(load(name, args.data_dir).requests, args.max_output)
            report[f"{name} (other trace)"] = evaluate(table, rest, other, q, args.cap)
    for split, result in report.items():
        print(f"{split}: {result['rows']} rows, q={q}")
        for name, s in result.items():
            if name != "rows":
                print(f"  {name:13s} " + "  ".join(f"{k} {v}" for k, v in s.items()))
    if args.out:
        table.save(args.out)
        print(f"table: {len(table.lower)} bins -> {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "report": report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
