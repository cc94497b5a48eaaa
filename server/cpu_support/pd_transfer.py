"""PD disaggregation on CPU: what SGLang's KV transfer needs on a host with no accelerator.

Applied when SGLang's Mooncake connector is imported (server/cpu_support/import_hooks.py), in
every process of a CPU server; no SGLang file is edited.
"""

from __future__ import annotations

from types import ModuleType

MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"


def send_page_indices_from_host(conn: ModuleType) -> None:
    """Upstream's Mooncake sender takes a prefill's page indices through a pinned host tensor
    filled by an asynchronous copy and a CUDA event (prefill._send_kv_chunk); a CPU host can pin
    nothing and has no CUDA event, so the sender takes the path every other sender takes."""
    conn.MooncakeKVSender.supports_host_tensor_indices = False


AFTER_IMPORT = {MOONCAKE_CONN: send_page_indices_from_host}
