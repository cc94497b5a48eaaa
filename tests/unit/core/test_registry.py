"""The registry helper: names, parameters checked against their dataclass with the field named,
and factories that get the host's context instead of guessing it from a signature."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduler.core.policies import POLICIES, PolicyContext, accepted_params, make_policy
from scheduler.core.registry import Entry, NoParams, ParamError, Registry, require


@dataclass(frozen=True)
class Speed:
    base_s: float = 0.01
    per_token_s: float = 1e-4


@dataclass(frozen=True)
class ToyParams:
    k: int = 2
    share: float = 0.5
    mode: str = "fast"
    tiers: tuple[float, ...] | None = None
    speed: Speed | None = None

    def __post_init__(self) -> None:
        require(self.k >= 1, "k", "must be at least 1", self.k)
        require(0.0 <= self.share <= 1.0, "share", "must be in [0, 1]", self.share)


@dataclass(frozen=True)
class Toy:
    params: ToyParams
    context: str


def toys() -> Registry[str, object]:
    return Registry(
        "toy",
        [Entry("toy", ToyParams, lambda p, ctx: Toy(p, ctx)), Entry("plain", NoParams, lambda p, ctx: "plain")],
    )


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ParamError, match=r"unknown toy 'nope'; known: plain, toy") as err:
        toys().make("nope", {}, "ctx")
    assert err.value.field is None and isinstance(err.value, ValueError)


def test_unknown_parameter_is_named_with_the_accepted_ones() -> None:
    with pytest.raises(ParamError, match=r"toy 'toy': takes no parameter 'kk' \(accepted: k, share, mode") as err:
        toys().make("toy", {"kk": 1}, "ctx")
    assert err.value.field == "kk"
    with pytest.raises(ParamError, match="accepted: none"):
        toys().make("plain", {"k": 1}, "ctx")


@pytest.mark.parametrize(
    ("values", "field", "text"),
    [
        ({"k": 0}, "k", "k must be at least 1, got 0"),
        ({"share": 2}, "share", r"share must be in \[0, 1\], got 2.0"),
        ({"k": 1.5}, "k", "k must be int, got 1.5"),
        ({"k": True}, "k", "k must be int, got True"),
        ({"mode": 3}, "mode", "mode must be str, got 3"),
        ({"tiers": "50,100"}, "tiers", "tiers must be a list or None"),
        ({"tiers": [50, "x"]}, "tiers[1]", r"tiers\[1\] must be float, got 'x'"),
        ({"speed": {"base_s": "slow"}}, "speed.base_s", "speed.base_s must be float, got 'slow'"),
        ({"speed": {"base": 1}}, "speed.base", "takes no parameter 'speed.base'"),
    ],
)
def test_an_invalid_value_names_its_field(values: dict, field: str, text: str) -> None:
    with pytest.raises(ParamError, match=text) as err:
        toys().make("toy", values, "ctx")
    assert err.value.field == field


def test_json_values_become_what_the_dataclass_declares() -> None:
    toy = toys().make("toy", {"share": 1, "tiers": [50, 100], "speed": {"base_s": 1}}, "ctx")
    assert toy.params == ToyParams(share=1.0, tiers=(50.0, 100.0), speed=Speed(base_s=1.0))
    assert isinstance(toy.params.share, float)
    assert toys().make("toy", {"tiers": None, "speed": None}, "ctx").params == ToyParams()


def test_the_factory_receives_the_context_and_the_checked_parameters() -> None:
    toy = toys().make("toy", {"k": 3}, "the host")
    assert toy == Toy(ToyParams(k=3), "the host")


def test_a_parameters_dataclass_checks_itself_when_built_directly() -> None:
    with pytest.raises(ParamError, match="share must be in") as err:
        ToyParams(share=-1.0)
    assert err.value.field == "share"


def test_names_parameters_and_defaults() -> None:
    reg = toys()
    assert list(reg) == reg.names() == ["toy", "plain"] and len(reg) == 2 and "toy" in reg
    assert reg.param_names("toy") == ("k", "share", "mode", "tiers", "speed")
    assert reg.defaults("toy")["share"] == 0.5 and reg.defaults("plain") == {}
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("toy", NoParams, lambda p, ctx: None)


def test_slo_policies_get_the_perf_model_from_the_context() -> None:
    perf = object()
    assert POLICIES.make("tempo", {}, PolicyContext(perf)).perf is perf
    assert make_policy("slos", perf_model=perf).perf is perf
    oracle = make_policy("gmax_oracle", perf_model=perf, cutoff=0.5)
    assert oracle.name == "gmax_oracle" and oracle.base.perf is perf and oracle.base.cutoff == 0.5
    assert accepted_params("tempo_oracle") == accepted_params("tempo")
    assert "perf_model" not in accepted_params("tempo")  # context, not a parameter
    with pytest.raises(ParamError, match="SLO policy 'sarathi': token_budget must be >= 1, got 0"):
        make_policy("sarathi", token_budget=0)
