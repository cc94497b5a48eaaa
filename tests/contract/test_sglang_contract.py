"""The installed SGLang against every internal sglang-slo relies on (tests/contract/internals.py).

Cheap (imports and source reads, no server): run it first on a new SGLang release; each failure
names the internal, what it lacks and what of ours breaks (docs/sglang.md).
"""

from __future__ import annotations

import pytest

from tests.contract.internals import CONTRACT, SAMPLING_FIELDS_NOT_FROM_CLIENTS
from tests.contract.sglang_contract import CallArity, Exists, Fields, ImportsFrom, Reads, SetsAttrs, Takes, check


def _id(entry: object) -> str:
    return f"{type(entry).__name__}:{getattr(entry, 'module', '')}.{getattr(entry, 'name', getattr(entry, 'cls', ''))}"


@pytest.mark.parametrize("entry", CONTRACT, ids=_id)
def test_the_installed_sglang_has_it(entry: object) -> None:
    assert check([entry]) == []


def test_slo_speculation_implements_sglangs_adaptive_policy_protocol() -> None:
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveSpecPolicy

    from scheduler.core.speculation_controller import SloSpeculation

    members = {name for name in vars(AdaptiveSpecPolicy) if not name.startswith("_")}
    assert members and members <= set(dir(SloSpeculation))


def test_every_sampling_parameter_sglang_takes_is_checked_or_known_internal() -> None:
    from sglang.srt.sampling.sampling_params import SamplingParams

    from scheduler.core.sampling_guard import CHECKS

    fields = set(SamplingParams.__struct_fields__)
    assert fields - set(CHECKS) - SAMPLING_FIELDS_NOT_FROM_CLIENTS == set()


# ---- the checker fails loudly when SGLang lacks an internal ----------------------------------------


def test_a_removed_method_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.managers.scheduler import Scheduler

    entries = [e for e in CONTRACT if isinstance(e, Exists | Takes) and e.name == "Scheduler.get_prefill_adder_class"]
    assert entries and check(entries) == []
    monkeypatch.delattr(Scheduler, "get_prefill_adder_class")
    problems = check(entries)
    assert len(problems) == 1 and "Scheduler.get_prefill_adder_class: missing" in problems[0]


def test_a_changed_signature_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.speculative import adaptive_runtime_state

    class OldController:  # SGLang 0.5.17's: the policy was assigned after construction
        def __init__(self, worker: object) -> None:
            self.worker = worker

    monkeypatch.setattr(adaptive_runtime_state, "AdaptiveController", OldController)
    entry = Takes(adaptive_runtime_state.__name__, "AdaptiveController.__init__", ("worker", "policy"), "why")
    assert check([entry]) == [
        f"{entry.module}.AdaptiveController.__init__: takes no policy (has ['self', 'worker']); why"
    ]


def test_missing_fields_attributes_and_ops_are_reported() -> None:
    assert check([Fields("sglang.srt.server_args", "ServerArgs", ("chunked_prefill_size", "no_such_flag"), "w")]) == [
        "sglang.srt.server_args.ServerArgs.no_such_flag: no such field; w"
    ]
    # 0.5.17's request attributes, gone in 0.5.23 (read silently as None before this contract)
    problems = check([SetsAttrs("sglang.srt.managers.schedule_batch", "Req", ("req_pool_idx", "prefix_indices"), "w")])
    assert [p.split(":")[0] for p in problems] == [
        "sglang.srt.managers.schedule_batch.Req.req_pool_idx",
        "sglang.srt.managers.schedule_batch.Req.prefix_indices",
    ]
    amx = "sglang.srt.layers.attention.intel_amx_backend"
    assert check([CallArity(amx, "IntelAMXAttnBackend", "forward_extend", "extend_attention_fwd", 19, "w")])
    served_without_one = frozenset({"assign_req_to_token_pool_cpu"}) - {"assign_req_to_token_pool_cpu"}
    assert check([ImportsFrom("sglang.srt.mem_cache.allocation", "sgl_kernel", served_without_one, "w")]) == [
        "sglang.srt.mem_cache.allocation imports assign_req_to_token_pool_cpu from sgl_kernel, which we do not serve; w"
    ]


def test_a_switch_sglang_stopped_reading_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.disaggregation import prefill

    entries = [e for e in CONTRACT if isinstance(e, Reads)]
    assert entries and check(entries) == []

    def send_always_pinned(self: object) -> None:  # a release that pins without asking the sender
        return None

    mixin = prefill.SchedulerDisaggregationPrefillMixin
    monkeypatch.setattr(mixin, "_send_kv_chunk", send_always_pinned)
    assert check(entries) == [
        f"sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin._send_kv_chunk: no longer reads "
        f"supports_host_tensor_indices; {entries[0].why}"
    ]


def test_an_sglang_module_that_is_gone_is_reported() -> None:
    assert check([Exists("sglang.srt.no_such_module", "Thing", "w")])[0].startswith(
        "sglang.srt.no_such_module.Thing: missing (cannot import"
    )
