"""One-off experiments: each reproduces or checks one claim, with the product packages
(benchmarks.goodput, benchmarks.simulator, benchmarks.planner) as its instruments. Their results
are on the results page; a user runs the product commands, not these.

Live, on emulated GPUs behind the real router and workers:
  emulated_routing      every routing policy on one heterogeneous emulated pool
  emulated_speculation  no speculation, a fixed length and the SLO-adaptive length
  pd_layouts            co-located against prefill-decode disaggregated pools
  overload              overload and soak: every request answered, shedding and Retry-After
  throughput            our server's throughput against stock SGLang at no urgency
  emulation_fidelity    how faithfully the emulated GPUs keep the profiles' time
  gpu_smoke (.sh)       ten minutes on one real GPU that say whether sglang-slo works there

In virtual time (the simulators) or offline:
  headline              the five papers' headline experiments in the cluster simulator
  headline_*            its pieces: one module per paper, the grid of runs, the rows
  scale                 hundreds of simulated instances behind one router
  simulator_validation  the cluster simulator against emulated workers behind the router
  tenant_fairness       fair shares between two flooding API keys
  ceiling               how many of a workload's requests a card could finish at all
  gain_plot             goodput x fcfs against load from `benchmarks.simulator.engine --json` files
  decision_latency      how long each policy takes to decide, per step and per request
  plan_path_latency     its plan-path part: one adapter pass, on recorded and adversarial states
"""
