"""What a simulated pool is made of: GPU cards, how many of each, and the role each group plays.

A pool is written `gpu:count[:role]` groups separated by commas, e.g. `h100:4,a40:8` (all
co-located) or `h100:2:prefill,h100:6:decode` (PD disaggregated). Cards are the shipped
GPU+model profiles (scheduler/profiles): steps take what the profile's table says (what the
emulator paces with), policies plan with its roofline (the server's prior).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from benchmarks.simulator.card import Card
from router.pd import DECODE, MIXED, PREFILL
from scheduler.core.perf_model import load_profile, profile_path

ROLES = (MIXED, PREFILL, DECODE)
# Illustrative on-demand prices in USD per GPU-hour (public cloud list prices vary by provider
# and region and change often: pass your own with --prices).
DEFAULT_PRICES = {"h100": 4.0, "a100": 2.5, "a40": 1.0}
KV_BYTES_PER_TOKEN = {"llama3-8b": 2 * 32 * 8 * 128 * 2}  # K and V x layers x KV heads x head dim x fp16


@dataclass(frozen=True)
class Group:
    gpu: str
    count: int
    role: str = MIXED


@dataclass(frozen=True)
class PoolSpec:
    groups: tuple[Group, ...]
    model: str = "llama3-8b"

    @classmethod
    def parse(cls, text: str, model: str = "llama3-8b") -> PoolSpec:
        groups = []
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            parts = item.split(":")
            if len(parts) not in (2, 3):
                raise ValueError(f"pool group {item!r}: expected gpu:count[:role]")
            gpu, count = parts[0].lower(), int(parts[1])
            role = parts[2].lower() if len(parts) == 3 else MIXED
            if count < 0 or role not in ROLES:
                raise ValueError(f"pool group {item!r}: count >= 0 and role one of {', '.join(ROLES)}")
            if count:
                groups.append(Group(gpu, count, role))
        if not groups:
            raise ValueError(f"pool {text!r} has no worker")
        spec = cls(tuple(groups), model)
        roles = {g.role for g in spec.groups}
        if (PREFILL in roles) != (DECODE in roles):
            raise ValueError(f"pool {text!r}: a PD pool needs both prefill and decode workers")
        return spec

    def __str__(self) -> str:
        return ",".join(f"{g.gpu}:{g.count}" + ("" if g.role == MIXED else f":{g.role}") for g in self.groups)

    @property
    def size(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def is_pd(self) -> bool:
        return any(g.role != MIXED for g in self.groups)

    def workers(self) -> list[tuple[str, str, str]]:
        """(worker id, gpu, role) per worker, named as launch_cluster names them (h100-0, a40-1, ...)."""
        return [(f"{g.gpu}-{i}", g.gpu, g.role) for i, g in enumerate(g for g in self.groups for _ in range(g.count))]

    def cost_per_hour(self, prices: Mapping[str, float]) -> float:
        missing = sorted({g.gpu for g in self.groups} - set(prices))
        if missing:
            raise ValueError(f"no price for {', '.join(missing)} (pass --prices gpu=usd_per_hour,...)")
        return sum(prices[g.gpu] * g.count for g in self.groups)


@cache
def card(gpu: str, model: str = "llama3-8b") -> Card:
    """A profile's card, loaded once per process (they are read-only)."""
    return Card.load(gpu, model)


@cache
def sglang_chunk(gpu: str, model: str = "llama3-8b") -> int:
    """SGLang's default chunked_prefill_size for the card's memory (server_args: 4096 below
    60 GB, 8192 up to 160 GB, 16384 above)."""
    gib = float(load_profile(profile_path(gpu, model))["hardware"]["mem_bytes"]) / 2**30
    return 2048 if gib < 35 else 4096 if gib < 60 else 8192 if gib < 160 else 16384


def parse_prices(text: str | None) -> dict[str, float]:
    prices = dict(DEFAULT_PRICES)
    for item in (p.strip() for p in (text or "").split(",")):
        if item:
            gpu, _, value = item.partition("=")
            prices[gpu.lower()] = float(value)
    return prices
