"""SLO-adaptive vs fixed-length vs no speculation, on SLOs-Serve's ChatBot and Coder and on
tight-TPOT chat tiers.

One emulated GPU (Llama-3-8B profile, every forward pass K = --slowdown times slower) serves the
same planned workload under each configuration:
- `none`: no speculation (SGLang's mixed prefill+decode batches, as our server runs on a GPU);
- `none:sync`: the same without SGLang's overlap schedule, which its speculation does not run
  with on a CPU (on a GPU it does): the baseline that differs from the speculative runs in the
  speculation alone;
- `fixed:S`: speculation (--algorithm: EAGLE with the tiny target's EAGLE head, or STANDALONE
  with its perturbed copy) at SGLang's fixed length S;
- `slo` (or `slo:S`): the same with --slo-speculation, the length chosen per batch among 0..4
  (or 0..S) (SLOs-Serve §3.2.3).
Both models skip their layers (the emulated step's stand-in); a drafted token is accepted with
probability --acceptance (the stated acceptance model, docs/emulation.md), and a draft pass is
charged --draft-ratio of the target's decode step on the emulated card (an EAGLE head on
Llama-3-8B reads ~10 % of the weights). SGLang keeps mixed batches under EAGLE (a mixed step's
decodes do not draft), not under STANDALONE. All configurations run the same policy (--policy).
SLOs: the paper's Tab. 2 — ChatBot 5x zero-load TTFT and 100 ms TPOT, Coder 5x and 50 ms; the
tight chat tiers ChatBot's TTFT with 20 or 10 ms — on the card's times, times K. Lengths: Azure
conversation (ChatBot, chat tiers) and code (Coder) traces, as in the paper's Tab. 4.

Prints per mix the attainment at each rate and the rate where it crosses --target (linear
between measured rates), the capacity ratios to `none` and to the fixed length, and per run the
lengths the engine used, the α it measured and how well the emulation kept pace.

  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.emulated_speculation                       # ~50 min
  PYTHONPATH=launch:. .venv/bin/python -m benchmarks.experiments.emulated_speculation --quick --mixes coder
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests

from benchmarks._server import BenchServer, prepare_live_cluster, resolve_model, stop_all
from benchmarks.experiments.emulated_routing import mix_scale, prompt_builder, workload
from benchmarks.experiments.pd_layouts import crossing
from benchmarks.goodput.emulation_validity import invalid_note, verdict
from benchmarks.goodput.harness import Target, header_run, run_once
from benchmarks.goodput.loadgen import LengthControl, LoadOptions
from benchmarks.goodput.report import describe, write_results
from benchmarks.goodput.scoring import check_consistency
from benchmarks.goodput.workload import SEED_SPAN_S, plan
from benchmarks.workloads.text import PromptText

MIX_SETUPS = {
    "chatbot": ("slos-chatbot", "azure-conv"),
    "coder": ("slos-coder", "azure-code"),
    "chat-tight": ("slos-chat-tight", "azure-conv"),  # ChatBot's TTFT, a 20 ms H100 TPOT
    "chat-tight10": ("slos-chat-tight10", "azure-conv"),  # and 10 ms
}
DRAFTS = {"EAGLE": "tiny-eagle", "STANDALONE": "tiny-draft"}  # the tiny target's drafts
FULL = {"units": 60, "rates": "chatbot=0.5,1,1.5;coder=0.5,1,1.5", "max_output": 128, "drain_timeout": 150.0}
QUICK = {"units": 12, "rates": "chatbot=2;coder=2", "max_output": 32, "drain_timeout": 60.0}


def config_flags(name: str, draft_ratio: float, algorithm: str = "EAGLE") -> list[str]:
    """Server flags of one configuration: none, fixed:S or slo."""
    if name == "none":
        return []
    if name == "none:sync":  # SGLang's speculation runs without the overlap schedule on CPU: the fair baseline
        return ["--disable-overlap-schedule"]
    draft = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", DRAFTS[algorithm]]
    ratio = [*draft, "--slo-spec-draft-ratio", str(draft_ratio)]
    if name == "slo" or name.startswith("slo:"):
        longest = name.partition(":")[2] or "4"
        if not longest.isdigit() or int(longest) < 1:
            raise ValueError(f"configuration {name!r}: slo:S with S >= 1 the longest candidate")
        steps = ",".join(str(s) for s in range(int(longest) + 1))
        return [*ratio, "--slo-speculation", "--slo-spec-steps", steps]
    kind, _, steps = name.partition(":")
    if kind != "fixed" or not steps.isdigit() or int(steps) < 1:
        raise ValueError(f"configuration {name!r}: none, none:sync, fixed:S (S >= 1), slo or slo:S")
    s = int(steps)
    return [*ratio, "--speculative-num-steps", str(s), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(s + 1)]  # fmt: skip


def parse_rates(text: str, mixes: list[str]) -> dict[str, list[float]]:
    """`chatbot=1,2;coder=2` (or one list for every mix)."""
    if "=" not in text:
        return {m: [float(x) for x in text.split(",") if x] for m in mixes}
    out: dict[str, list[float]] = {}
    for part in text.split(";"):
        mix, _, values = part.partition("=")
        out[mix.strip()] = [float(x) for x in values.split(",") if x]
    missing = [m for m in mixes if m not in out]
    if missing:
        raise SystemExit(f"--rates: no rates for {', '.join(missing)}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.experiments.emulated_speculation", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--configs", default="none,fixed:3,slo")
    p.add_argument("--mixes", default="chatbot,coder", help=f"of {', '.join(MIX_SETUPS)}")
    p.add_argument("--rates", help=f"units/s per mix, e.g. {FULL['rates']!r}")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--slowdown", type=float, default=16.0)
    p.add_argument("--draft-ratio", type=float, default=0.1, help="draft step / target decode step (emulated)")
    p.add_argument("--algorithm", default="EAGLE", choices=sorted(DRAFTS), help="the draft (tiny-eagle or tiny-draft)")
    p.add_argument("--acceptance", type=float, default=0.8, help="--emulate-draft-acceptance of the draft")
    p.add_argument("--policy", default="edf", help="--slo-policy of every configuration")
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--units", type=int)
    p.add_argument("--length-scale", type=float, default=1.0)
    p.add_argument("--max-prompt", type=int, default=2048)
    p.add_argument("--max-output", type=int)
    p.add_argument("--drain-timeout", type=float)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0, help="the trace window: seed x 600 s into the trace")
    p.add_argument("--quick", action="store_true", help="a few requests per run, one rate")
    p.add_argument("--data-dir", help="traces folder (default $SGLANG_SLO_DATA or ../shared/data)")
    p.add_argument("--out", type=Path, default=Path("results/speculation"))
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.config_list = [c.strip() for c in args.configs.split(",") if c.strip()]
    for name in args.config_list:
        config_flags(name, args.draft_ratio, args.algorithm)  # fail on a typo before any server starts
    args.mix_list = [m.strip() for m in args.mixes.split(",") if m.strip()]
    unknown = [m for m in args.mix_list if m not in MIX_SETUPS]
    if unknown:
        p.error(f"--mixes: unknown {', '.join(unknown)}")
    args.rates_of = parse_rates(args.rates, args.mix_list)
    # what benchmarks.goodput's run_once reads
    args.control, args.client_max_tokens, args.duration = LengthControl.HINT, 1024, None
    args.drain_until_due, args.max_drain = LoadOptions.drain_until_due, LoadOptions.max_drain_s
    args.quiet, args.bin_s = True, None
    return args


def speculation_line(status: dict[str, Any] | None) -> str:
    engine = (status or {}).get("engine") or {}
    spec, emu = engine.get("speculation") or {}, engine.get("emulation") or {}
    used = spec.get("steps_used") or {}
    verifies = sum(used.values())
    mean = sum(int(k) * v for k, v in used.items()) / verifies if verifies else None
    parts = [f"late steps {emu.get('late_share', 0):.1%}"]
    if spec:
        parts.append(f"length now {spec.get('steps')}")
        if mean is not None:
            parts.append(f"mean {mean:.2f} over {verifies} verifies, used {used}")
        if spec.get("alpha") is not None:
            parts.append(f"alpha {spec['alpha']:.3f}")
    return "   spec: " + ", ".join(parts)


def warm_up(url: str) -> None:
    """The first forward passes of a fresh server (and its draft) are slow on CPU: spend them
    before measuring, so no configuration pays them inside a run (they would show as late steps)."""
    for n_prompt, n_out in ((16, 8), (1500, 8), (16, 48)):
        ids = [5 + (i * 7) % 500 for i in range(n_prompt)]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}}
        requests.post(url + "/generate", json=body, timeout=300).raise_for_status()


def flush(url: str) -> None:
    """Each run replays the same prompts: empty the prefix cache first."""
    requests.post(url + "/flush_cache", timeout=60)


def _kept_pace(run: dict[str, Any]) -> bool:
    return verdict(run["config"].get("pacing"))["valid"] is not False


def summary(mix: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    rates = args.rates_of[mix]
    lines = [f"### {mix} (attainment at units/s; capacity at {args.target:.0%})", ""]
    lines.append("| config | " + " | ".join(f"{r:g}" for r in rates) + " | capacity |")
    lines.append("|---|" + "---|" * (len(rates) + 1))
    capacity: dict[str, float | None] = {}
    for config in args.config_list:
        mine = {r["rate"]: r["metrics"].attainment for r in runs if r["label"] == config}
        cap, note = crossing(sorted(mine.items()), args.target)
        capacity[config] = cap
        invalid = {r["rate"] for r in runs if r["label"] == config and not _kept_pace(r)}
        cells = [f"{mine[r]:.0%}" + (" INVALID" if r in invalid else "") if r in mine else "-" for r in rates]
        above = " (all rates met it)" if note == "above" else ""
        shown = f"< {min(rates):g}" if cap is None else f"{cap:.2f}{above}"
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {shown} |")
    if note := invalid_note(runs):
        lines += ["", note]
    for name in ("none", "none:sync"):
        base = capacity.get(name)
        for config, cap in capacity.items():
            if not config.startswith("none") and cap and base:
                lines.append(f"\n{config} / {name} capacity: {cap / base:.2f}x")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_live_cluster()
    text = PromptText(resolve_model("tiny"))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.mix_list}
    common = ["--emulate-gpu", args.gpu, "--emulate-slowdown", f"{args.slowdown:g}", "--slo-policy", args.policy,
              "--emulate-draft-acceptance", str(args.acceptance),
              "--max-running-requests", str(args.max_running_requests)]  # fmt: skip
    try:
        for config in args.config_list:
            print(f"== {config}", flush=True)
            flags = config_flags(config, args.draft_ratio, args.algorithm)
            server = BenchServer("tiny", [*common, *flags], name=config).start()
            try:
                warm_up(server.url)
                target = Target(config, server.url, args)
                for mix in args.mix_list:
                    slo_mix, trace = MIX_SETUPS[mix]
                    margs = argparse.Namespace(**{**vars(args), "trace": trace})
                    spec = replace(workload(margs, slo_mix), start_s=args.seed * SEED_SPAN_S)
                    scale = mix_scale(slo_mix, args.slowdown)
                    for rate in args.rates_of[mix]:
                        flush(server.url)
                        print(f"-- {mix} / {config} @ {rate:g} units/s", flush=True)
                        run = run_once(target, plan(spec, rate, scale), prompt_builder(text, spec), margs, rate)
                        runs[mix].append(header_run(run, {"config": config, "mix": mix}))
                        print(describe(run) + "\n" + speculation_line(run["config"]["slo_status"]), flush=True)
                        write_results(args.out / mix, runs[mix])
            finally:
                server.stop()
    finally:
        stop_all()
    sections = [summary(m, runs[m], args) for m in args.mix_list]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(sections))
    (args.out / "args.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}))
    print("\n" + "\n".join(sections), flush=True)
    bad = [r for mine in runs.values() for r in mine if r["metrics"].lost or check_consistency(r["metrics"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
