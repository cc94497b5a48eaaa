"""The PD benchmark's layout parsing, worker roles and goodput-at-target interpolation."""

from __future__ import annotations

import pytest

from benchmarks.experiments.pd_layouts import crossing, layout_workers, parse_args, parse_layout


def test_layouts_parse_and_refuse_nonsense() -> None:
    assert parse_layout("co:4").prefill == 0 and parse_layout("co:4").size == 4
    pd = parse_layout("pd:1+3")
    assert (pd.name, pd.prefill, pd.decode) == ("pd1+3", 1, 3)
    for bad in ("pd:0+3", "pd:2", "co:0", "xx:1", "pd:a+b"):
        with pytest.raises(ValueError, match="co:N or pd:P"):
            parse_layout(bad)


def test_a_pd_layout_gets_prefill_and_decode_workers() -> None:
    args = parse_args(["--layouts", "pd:2+1", "--quick"])
    specs = layout_workers(args.layout_list[0], args)
    assert [s.role for s in specs] == ["prefill", "prefill", "decode"]
    assert specs[0].bootstrap_port is None  # free ports are picked when the Cluster starts
    specs[0].bootstrap_port = 40000
    argv = specs[0].argv()
    assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
    assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == "40000"
    assert specs[2].argv()[specs[2].argv().index("--disaggregation-mode") + 1] == "decode"
    co = layout_workers(parse_layout("co:2"), args)
    assert all(s.role is None and "--disaggregation-mode" not in s.argv() for s in co)


def test_crossing_interpolates_between_the_rates_around_the_target() -> None:
    assert crossing([(2.0, 1.0), (4.0, 0.8)], 0.9) == (3.0, "interpolated")
    assert crossing([(4.0, 0.8), (2.0, 1.0), (6.0, 0.5)], 0.9) == (3.0, "interpolated")  # any order
    assert crossing([(2.0, 0.95), (4.0, 0.92)], 0.9) == (4.0, "above")  # a lower bound
    assert crossing([(2.0, 0.7)], 0.9) == (None, "below")
    assert crossing([], 0.9) == (None, "below")


def test_unknown_mixes_and_policies_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--mixes", "nope"])
    with pytest.raises(SystemExit):
        parse_args(["--policies", "nope"])


def test_a_mix_can_have_its_own_rates() -> None:
    args = parse_args(["--rates", "4,8", "--mix-rates", "chatbot=1,2"])
    assert args.rates_of["chatbot"] == [1.0, 2.0] and args.rates_of["polyserve"] == [4.0, 8.0]
    with pytest.raises(SystemExit):
        parse_args(["--mix-rates", "nope=1"])
