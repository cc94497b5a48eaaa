"""The launcher's command-line plumbing: reading flags, the CPU engine's defaults and model aliases.

SGLang on a CPU needs settings it does not pick itself (device, attention backend, a KV pool
that fits); each is a default the user can override by passing the flag.
"""

from __future__ import annotations

from pathlib import Path

# Flags (and values) the CPU engine needs unless the user passed them.
CPU_DEFAULTS: list[tuple[str, str | None]] = [
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--cuda-graph-backend-decode", "disabled"),
    ("--cuda-graph-backend-prefill", "disabled"),
    ("--skip-server-warmup", None),
    ("--dtype", "float32"),
    # SGLang checks the KV pool against memory still free after loading, as a share of what was
    # free before: another server allocating on the same host meanwhile can take more than a
    # small share, and the start fails. A large share only loosens that check: the KV pool
    # itself stays capped by --max-total-tokens (a draft model's weights count against it too).
    ("--mem-fraction-static", "0.8"),
    ("--max-total-tokens", "16384"),
    # SGLang's CPU default chunk is 4096; a prefill step of twice the tokens stalls every running
    # decode twice as long on a few cores, and our CPU benchmarks and tests are sized at 2048.
    ("--chunked-prefill-size", "2048"),
    ("--sleep-on-idle", None),
]
# PD disaggregation on CPU (../shared/notes: PD section): Mooncake over TCP, one token per page
# (larger pages reach a Triton kernel).
CPU_PD_DEFAULTS: list[tuple[str, str | None]] = [
    ("--disaggregation-transfer-backend", "mooncake_tcp"),
    ("--page-size", "1"),
]
# PD decode on CPU: SGLang infers the backup that keeps a retracted request's KV from the KV pool
# and picks a HiCache host pool, which it sizes after a reserve of host memory a CPU serving host
# rarely has free; per-request CPU tensors keep the KV in the same host memory without the reserve.
CPU_PD_DECODE_DEFAULTS: list[tuple[str, str | None]] = [
    ("--disaggregation-decode-retraction-backup", "cpu_tensor"),
]
# Speculative decoding on CPU (../shared/notes: speculative section): SGLang's intel_amx backend on
# our pure-torch ops (server/cpu_support/speculation.py).
CPU_SPEC_DEFAULTS: list[tuple[str, str | None]] = [
    ("--attention-backend", "intel_amx"),
]
# Environment the CPU PD path needs: the early cached-prefix send creates a torch.cuda.Event;
# servers must advertise loopback, not the external interface, for KV bootstrap.
CPU_PD_ENV = {"SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0", "SGLANG_HOST_IP": "127.0.0.1"}
MODEL_ALIASES = ("default", "tiny", "tiny-gpu", "tiny-draft", "tiny-eagle", "tiny-eagle3")


def _has_flag(argv: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def _flag_value(argv: list[str], *flags: str) -> str | None:
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(f + "="):
                return a.split("=", 1)[1]
    return None


def _wants_cpu(argv: list[str]) -> bool:
    device = _flag_value(argv, "--device")
    if device is not None:
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()


def _resolve_model(argv: list[str]) -> list[str]:
    """Fill in or expand the model path: default (SmolLM2) or tiny, prepared on first use; the
    same aliases, plus the tiny target's drafts tiny-draft (STANDALONE), tiny-eagle (EAGLE) and
    tiny-eagle3 (EAGLE3), work for --speculative-draft-model-path."""
    from server.models import ensure_default_model

    if _flag_value(argv, "--model-path", "--model") is None:
        argv = argv + ["--model-path", str(ensure_default_model())]
    argv = _expand_alias(argv, ("--model-path", "--model"))
    return _expand_alias(argv, ("--speculative-draft-model-path",))


def _expand_alias(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    from server import models

    value = _flag_value(argv, *flags)
    if value not in MODEL_ALIASES:
        return argv
    build = {
        "default": models.ensure_default_model,
        "tiny": models.ensure_tiny_model,
        "tiny-gpu": models.ensure_tiny_gpu_model,  # head size and dtype GPU attention backends take
        "tiny-draft": models.ensure_tiny_draft_model,
        "tiny-eagle": models.ensure_tiny_eagle_model,  # --speculative-algorithm EAGLE
        "tiny-eagle3": models.ensure_tiny_eagle3_model,  # --speculative-algorithm EAGLE3
    }
    path = str(build[value]())
    out = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in flags and i + 1 < len(argv):
            out += [a, path]
            skip = True
        elif a.startswith(tuple(f + "=" for f in flags)):
            out.append(a.split("=", 1)[0] + "=" + path)
        else:
            out.append(a)
    return out


def _with_defaults(argv: list[str], defaults: list[tuple[str, str | None]]) -> list[str]:
    extra: list[str] = []
    for flag, value in defaults:
        if not _has_flag(argv, flag):
            extra += [flag] if value is None else [flag, value]
    return argv + extra


def cpu_threads_binding(ranks: int, cores: list[int], numa_nodes: int) -> str | None:
    """SGLANG_CPU_OMP_THREADS_BIND for `ranks` scheduler ranks on CPU (dp x tp x pp: SGLang binds
    one NUMA node per rank and refuses more ranks than nodes), so past that each rank gets its own
    share of `cores` ("0|1" on two cores). None: SGLang's per-node default fits, or there are too
    few cores (SGLang says so)."""
    if ranks <= max(1, numa_nodes) or len(cores) < ranks:
        return None
    cores = sorted(cores)
    share = len(cores) // ranks
    groups = [cores[i * share : (i + 1) * share] for i in range(ranks)]
    return "|".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in groups)


def scheduler_ranks(argv: list[str]) -> int:
    """How many scheduler processes SGLang starts on this node: one per TP rank of each pipeline
    stage of each data-parallel replica (what SGLang counts against NUMA nodes)."""
    sizes = (("--tp-size", "--tensor-parallel-size"), ("--dp-size", "--data-parallel-size"), ("--pp-size",))
    ranks = 1
    for flags in sizes:
        ranks *= int(_flag_value(argv, *flags) or 1)
    return ranks


def _numa_nodes() -> int:
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1


def _with_cpu_defaults(argv: list[str]) -> list[str]:
    import os

    binding = cpu_threads_binding(scheduler_ranks(argv), sorted(os.sched_getaffinity(0)), _numa_nodes())
    if binding is not None:
        os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", binding)
    if _flag_value(argv, "--speculative-algorithm"):
        from server.cpu_support.speculation import enable_cpu_speculation

        enable_cpu_speculation()  # before ServerArgs are resolved: keeps intel_amx selected
        argv = _with_defaults(argv, CPU_SPEC_DEFAULTS)
    role = _flag_value(argv, "--disaggregation-mode")
    if role in ("prefill", "decode"):
        for name, value in CPU_PD_ENV.items():
            os.environ.setdefault(name, value)
        argv = _with_defaults(argv, CPU_PD_DEFAULTS)  # before the CPU defaults: they win over those
    if role == "decode":
        argv = _with_defaults(argv, CPU_PD_DECODE_DEFAULTS)
    return _with_defaults(argv, CPU_DEFAULTS)


def kv_host_ip(argv: list[str]) -> str | None:
    """The address a PD worker's KV transfer is announced at (SGLang reads SGLANG_HOST_IP):
    --advertise-host, else the local address of the route to a router off this machine (what the
    router sees it connect from); None: SGLang's own choice (127.0.0.1 on CPU)."""
    if _flag_value(argv, "--disaggregation-mode") not in ("prefill", "decode"):
        return None
    host = _flag_value(argv, "--advertise-host")
    if host:
        return host
    router = _flag_value(argv, "--router-address")
    from router.transport import is_loopback, local_address_towards

    if router and not is_loopback(router):
        return local_address_towards(router)
    return None
