"""The capacity planner: the cheapest pool of GPUs that serves a workload at a target SLO
attainment, found by simulating candidate pools with the cluster simulator (benchmarks.simulator).

  python -m benchmarks.planner --mix slos-chatbot --rate 20 --gpus h100=4.0,a40=1.1 --target 0.9
"""
