"""What a simulated engine's policy sees: its requests as views, built only when a plan is
asked for and refreshed in place across passes, as the SGLang adapter keeps them."""

from __future__ import annotations

from scheduler.core.sim_ledger import SimLedger
from scheduler.core.sim_requests import RequestState
from scheduler.core.types import EngineView, RequestView


class SimViews(SimLedger):
    """The engine's views (see SimEngine)."""

    def view(self, now: float) -> EngineView:
        """What the policy sees now: every waiting and running request, engine limits."""
        live = self._live_service()
        return EngineView(
            now=now,
            waiting=[self._waiting_view(st, live) for st in self.waiting],
            running=self._running_views(live),
            max_running_requests=self.cfg.max_running_requests,
            chunk_size=self.cfg.chunk_size,
            free_kv_tokens=self.cfg.total_kv_tokens - self.kv_used,
            total_kv_tokens=self.cfg.total_kv_tokens,
            step=self.steps,
        )

    def _live_service(self) -> dict[str, int]:
        """Decode tokens of the running segments, per key: what `_attained` has not folded in yet."""
        live: dict[str, int] = {}
        n = len(self.decode_times)
        for st in self.running.values():
            if st.decoding:
                key = st.key
                live[key] = live.get(key, 0) + n - st.seg_start
        return live

    def _waiting_view(self, st: RequestState, live: dict[str, int]) -> RequestView:
        """A waiting request's view; one that has not run since its last refresh, counts its
        service alone (no program) and has no predictor to re-ask, only changes its tier."""
        view = st.view
        if st.view_settled and view is not None:
            view.best_effort_tier = st.be_tier
            return view
        view = self._view(st, live)
        st.view_settled = st.key == st.req.rid and self.predictor is None and not self.record_trace
        return view

    def _running_views(self, live: dict[str, int]) -> list[RequestView]:
        """Running requests' views: `_view`'s refresh inlined, since it runs for every running
        request at every planned step (what changes: tokens, service, the first token)."""
        if self.record_trace or self.predictor is not None:
            return [self._view(st, live) for st in self.running.values()]
        n = len(self.decode_times)
        attained = self._attained
        out = []
        for st in self.running.values():
            view = st.view
            if view is None:
                out.append(self._view(st, live))
                continue
            view.generated = st.gen_base + (n - st.seg_start if st.decoding else 0)
            view.first_token_time = st.first_token_time
            view.attained_service = attained.get(st.key, 0.0) + live.get(st.key, 0)
            view.best_effort_tier = st.be_tier
            out.append(view)
        return out

    def _view(self, st: RequestState, live: dict[str, int]) -> RequestView:
        r = st.req
        key = st.key
        generated = self.generated(st)
        attained = self._attained.get(key, 0.0) + live.get(key, 0)
        predicted = r.predicted_output_len
        if self.predictor is not None:
            predicted = self.predictor(r, generated)
        view = st.view
        if view is None or self.record_trace:  # a recorded trace keeps each step's own views
            view = RequestView(
                rid=r.rid,
                slo=r.slo,
                arrival=r.arrival,
                prompt_len=r.prompt_len,
                generated=generated,
                max_new_tokens=r.max_new_tokens,
                predicted_output_len=predicted,
                first_token_time=st.first_token_time,
                prefix_cached=self.prefix.cached_tokens(r.prefix_hashes, r.prompt_len)
                if self.prefix is not None and r.prefix_hashes
                else 0,
                program_arrival=r.program_arrival,
                stage_deadline=r.stage_deadline,
                attained_service=attained,
                best_effort_tier=st.be_tier,
                oracle_output_len=r.output_len if self.oracle else None,
                tenant=r.tenant,
                share=r.share,
            )
            if not self.record_trace:
                st.view = view
            return view
        # Kept across passes, as the adapter keeps them: a policy must not hold one beyond plan().
        view.generated = generated
        view.predicted_output_len = predicted
        view.first_token_time = st.first_token_time
        view.attained_service = attained
        view.best_effort_tier = st.be_tier
        return view
