"""The engine-agnostic SLO policy core.

Plain Python (numpy/scikit-learn/quantile-forest only): it never imports sglang or torch, so
the same objects run inside the SGLang scheduler, the GPU-pacing emulator and the simulator.
"""
