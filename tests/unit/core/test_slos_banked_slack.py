"""SLOs-Serve's batch time with banked slack: Alg. 2 sizes every batch by the tightest TPOT,
which, when that TPOT is near the decode step, leaves prefill almost nothing even while the
decoders run far ahead of their deadline-based schedule. Their banked slack buys this step a
longer batch, and the DP counts that extra prefill once, where it admits more: otherwise the
longer batch is only a longer wait for the next arrivals."""

from __future__ import annotations

from scheduler.core.perf_model import linear_model
from scheduler.core.policies import make_policy
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.slos_serve.dp import DpItem, TierBudget
from scheduler.core.slos_serve.soft_admission import admit
from scheduler.core.types import EngineView, RequestView, StepPlan
from tests.unit.core.slos_cases import PACED, chat_beside_a_deadline

PERF = linear_model(base_s=0.01, per_token_s=1e-4)  # 10 ms + 0.1 ms per token
TIGHT = SloSpec(ttft_ms=100, tpot_ms=12, slo_class=SloClass.LATENCY)


def _plan(ahead_s: float, prompts: tuple[int, ...] = (400,), banked_slack: bool = True) -> StepPlan:
    """Four decoders that have made 10 tokens, `ahead_s` before their next one is due, and
    waiting prompts with a 100 ms TTFT. A 12 ms batch beside the decodes carries 16 tokens."""
    now = (100 + 9 * 12) / 1000 - ahead_s
    running = [RequestView(f"d{i}", TIGHT, 0.0, 100, generated=10, first_token_time=0.05) for i in range(4)]
    waiting = [RequestView(f"w{i}", TIGHT, now, p) for i, p in enumerate(prompts)]
    view = EngineView(now, waiting, running, 256, 8192, 10**6, 10**6)
    return make_policy("slos", perf_model=PERF, banked_slack=banked_slack).plan(view)


def test_decoders_ahead_of_schedule_pay_for_a_longer_batch_and_the_prompt_is_admitted() -> None:
    alg2 = _plan(0.2, banked_slack=False)
    banked = _plan(0.2)
    # TPOT-long batches carry 16 tokens: 400 do not fit in 100 ms, so Alg. 2 declines
    assert alg2.best_effort == {"w0"} and alg2.chunk_size == 16
    # 200 ms banked: this step may run to the arrival bound (150 ms alone: 1 400 tokens)
    assert banked.best_effort == set() and banked.order == ["w0"]
    assert banked.chunk_size == 1400
    assert banked.batch_cap == alg2.batch_cap  # the decoders' cap is still the TPOT's


def test_decoders_on_schedule_leave_alg2_as_it_is() -> None:
    on_pace = _plan(0.0)
    assert on_pace.best_effort == {"w0"} and on_pace.chunk_size == 16


def test_the_banked_batch_is_counted_once() -> None:
    # one longer batch then 16-token batches: about 1 530 tokens in 100 ms, not two 1 000s
    plan = _plan(0.2, prompts=(1000, 1000))
    assert len(plan.best_effort) == 1 and plan.order[0] not in plan.best_effort


def test_no_longer_batch_where_alg2_already_admits_everything() -> None:
    # 100 tokens fit the 16-token batches within 100 ms: nothing to win by a longer batch
    plan = _plan(0.2, prompts=(100,))
    assert plan.best_effort == set() and plan.chunk_size == 16


def test_admission_says_whether_the_admitted_set_needs_the_credit() -> None:
    # six tokens per unit, three decoders at a 1-unit TPOT: each batch carries 3 prefill tokens,
    # 18 by time 6; two 12-token prompts due at 6 fit only with 6 tokens more in the first batch
    budget = TierBudget(linear_model(base_s=0.0, per_token_s=1 / 6), [1.0])
    two = [DpItem(f"new{i}", 6.0, 12, tier=0) for i in range(2)]
    alone = admit(two, budget, (3, 0), now=0.0)
    credited = admit(two, budget, (3, 0), now=0.0, credit=6.0)
    assert len(alone.admitted) == 1 and len(credited.admitted) == 2 and credited.credit_used
    assert not admit(two[:1], budget, (3, 0), now=0.0, credit=6.0).credit_used


def test_a_running_deadline_under_the_derived_floor_still_holds_the_chunk_to_its_pace() -> None:
    # 195 tokens left in 5.9 s: a 30 ms pace, under slos's derived-TPOT floor (4 single-decoder
    # steps, 40 ms here) so its DP leaves it without a tier, but over two steps of the running
    # batch, where every SLO policy's chunk keeps it (batch_limits)
    view = chat_beside_a_deadline(6000)
    alg2 = make_policy("slos", perf_model=PACED, banked_slack=False).plan(view)
    held = make_policy("slos", perf_model=PACED).plan(view)
    assert alg2.chunk_size == 389  # the 50 ms tier's batch
    assert held.chunk_size is not None and held.chunk_size < alg2.chunk_size
    pace, kv = 5.9 / 195, 11 * 105
    step = PACED.step_time
    assert step(held.chunk_size, 11, kv) * 1.1 <= pace < step(held.chunk_size + 8, 11, kv) * 1.1
