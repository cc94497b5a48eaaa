"""The goodput benchmark: open-loop load from real traces with the papers' SLO mixes, scored
client-side, compared side by side across policies and servers (ours, stock SGLang, a router).

The load generator is loadgen.py, client-side scoring is scoring.py (both shared with the simulators: a
simulated run is scored exactly as a live one), the live-run harness harness.py.

  python -m benchmarks.goodput --policies fcfs,edf --model-path tiny --units 40 --rates 2
  python -m benchmarks.goodput.sweep --seeds 0,1,2 --baseline fcfs -- --policies fcfs,edf ...
"""
