"""A GPU+model profile as the simulators use it: the table a step really takes (what the emulator
paces with) and the roofline the policies plan with (the server's prior), kept apart so a policy
never plans with the truth."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.perf_model import PerfModel, load_perf_model, load_profile, profile_path


@dataclass(frozen=True)
class Card:
    """A GPU+model profile as the simulator uses it."""

    name: str
    pace: PerfModel  # what a step really takes (the emulator's table)
    plan_with: PerfModel  # what the policies predict with (the server's roofline prior)
    kv_tokens: int

    @classmethod
    def load(cls, gpu: str, model: str = "llama3-8b") -> Card:
        path = profile_path(gpu, model)
        profile = load_profile(path)
        return cls(
            name=f"{gpu}/{model}",
            pace=load_perf_model(path, kind="table"),
            plan_with=load_perf_model(path, kind="roofline"),
            kv_tokens=int(profile["kv_token_capacity"]),
        )
