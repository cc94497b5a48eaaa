"""The cluster simulator: many engines, one router, virtual time, the very objects the server runs.

Every engine is a `scheduler.core.sim_engine.SimEngine` running the server's engine policy on
the one plan path; every routing decision is made by the router's own policy object
(router/policies) over the same `WorkerView`s the live router builds from the workers' load
reports (the worker agent's own estimator, `server.agent_load.LoadEstimator`, fed in virtual
time); PD pairs are chosen by the router's `PrefillChooser`; speculation lengths by
`scheduler.core.speculation_controller.SloSpeculation`. Step times come from the GPU profiles the emulator
paces with. Workloads, SLO mixes, metrics and result files are the live benchmarks' own.

  python -m benchmarks.simulator --pool h100:4,a40:4 --routing goodserve --mix goodserve --rates 40
"""
