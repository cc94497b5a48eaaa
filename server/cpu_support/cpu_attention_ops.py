"""Pure-torch `sgl_kernel::decode_attention_cpu` / `extend_attention_cpu` for SGLang's intel_amx backend.

SGLang's `intel_amx` attention backend is the only CPU backend with speculative-decoding support
(draft decode over an expanded req->token table, tree-masked target verify), but it calls two
AMX C++ kernels through `torch.ops.sgl_kernel`. The CUDA sgl-kernel wheel does not ship them, so
this module registers plain-torch equivalents under the same namespace and argument order
(see `IntelAMXAttnBackend.forward_decode` / `forward_extend` in SGLang 0.5.23).

Semantics (checked against SGLang's Triton decode/extend kernels):

* `key_scale`/`value_scale` dequantise what is read from the KV pools (an fp8 cache's per-layer
  scales; 1.0 otherwise); the new tokens' K/V given as arguments are not scaled.
* Scores are `sm_scale * q.k`, then `logit_cap * tanh(s / logit_cap)` when `logit_cap > 0`;
  softmax and accumulation run in float32 whatever the input dtype.
* GQA: query head `h` reads KV head `h // (Hq // Hkv)`.
* `sliding_window_size` is `layer.sliding_window_size + 1` (0 = no window): a query at absolute
  position `i` sees keys at positions `j > i - sliding_window_size`.
* `sinks` (per query head) add `exp(sink)` to the softmax denominator only.
* `encoder_lens` (encoder-decoder models): self-attention KV starts `encoder_lens[b]` columns into
  the request's req_to_token row; cross-attention sees exactly the first `encoder_lens[b]` columns.
* Decode writes `key`/`value` into the KV pools at `loc` first (the backend does not), then
  attends to `req_to_token[req_pool_indices[b], :seq_lens[b]]`.
* Extend: `seq_lens` = prefix + extend; the prefix is fully visible, the extend part is causal,
  or follows `tree_mask` when one is given (speculative verify); with `is_causal=False`
  (encoder-only layers) every new token sees every other.

`tree_mask` layouts (flat bool, one block per request, concatenated in batch order):

* QLEN_ONLY (what SGLang builds on CPU, `default_tree_mask_mode()`): `e_b x e_b` per request,
  row = draft query, column = draft key.
* FULL_MASK (GPU layout, Triton `custom_mask` + `mask_indptr = cumsum(e_b * seq_len_b)`):
  `e_b x seq_len_b` per request; only the draft columns are read (prefix always visible, as
  in the Triton kernel's default `skip_prefix_custom_mask=True`).

The layout is told apart by size; anything else (e.g. bit-packed masks) is rejected.
"""

from __future__ import annotations

import threading

import torch

NAMESPACE = "sgl_kernel"

DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, "
    "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
    "Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn=False, "
    "int sliding_window_size=0, Tensor? encoder_lens=None, Tensor? sinks=None) -> ()"
)

EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, "
    "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
    "bool is_cross_attn=False, int sliding_window_size=0, Tensor? encoder_lens=None, Tensor? sinks=None, "
    "Tensor? tree_mask=None, bool is_causal=True) -> ()"
)

# Upper bound on gathered K+V elements per decode chunk, so long contexts x big batches do not
# materialise one huge padded tensor.
_DECODE_CHUNK_ELEMENTS = 1 << 24

_library: torch.library.Library | None = None
_lock = threading.Lock()


def _scores(q: torch.Tensor, k: torch.Tensor, equation: str, sm_scale: float, logit_cap: float) -> torch.Tensor:
    s = torch.einsum(equation, q, k) * sm_scale
    if logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    return s


def _softmax_with_sink(scores: torch.Tensor, visible: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """Masked softmax over the last dim; `sink` (broadcastable to scores[..., :1]) joins only the
    denominator. Rows that see nothing get all-zero weights instead of NaN."""
    scores = scores.masked_fill(~visible, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink - m)
    return p / denom.clamp_min(torch.finfo(torch.float32).tiny)


def _scaled(cached: torch.Tensor, scale: float) -> torch.Tensor:
    """KV read from a pool, in float32, dequantised by the layer's scale."""
    values = cached.to(torch.float32)
    return values if scale == 1.0 else values * scale


def _as_list(t: torch.Tensor | None, n: int) -> list[int] | None:
    if t is None or t.numel() == 0:
        return None
    values = [int(x) for x in t.reshape(-1).tolist()]
    if len(values) < n:
        raise ValueError(f"expected at least {n} entries, got {len(values)}")
    return values[:n]


def _sink_view(sinks: torch.Tensor | None, num_kv_heads: int, group: int) -> torch.Tensor | None:
    if sinks is None:
        return None
    return sinks.reshape(num_kv_heads, group).to(torch.float32)


def _write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, loc: torch.Tensor
) -> None:
    slots = loc.reshape(-1).to(torch.long)
    k_cache[slots] = key.reshape(slots.numel(), *k_cache.shape[1:]).to(k_cache.dtype)
    v_cache[slots] = value.reshape(slots.numel(), *v_cache.shape[1:]).to(v_cache.dtype)


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """One-token attention per row of `query`; stores the new K/V at `loc` first because the
    intel_amx backend leaves that write to the kernel. `attn_logits` (split-KV scratch) is unused."""
    if key is not None and value is not None and loc.numel() > 0:
        _write_kv(k_cache, v_cache, key, value, loc)
    bs, num_heads, head_dim = query.shape
    if bs == 0:
        return
    num_kv_heads = k_cache.shape[-2]
    group = num_heads // num_kv_heads
    if group * num_kv_heads != num_heads:
        raise ValueError(f"query heads {num_heads} not a multiple of KV heads {num_kv_heads}")
    head_dim_v = v_cache.shape[-1]

    if seq_lens.numel() < bs or req_pool_indices.numel() < bs:
        # e.g. draft decode given per-request rather than per-candidate lengths
        raise ValueError(
            f"{bs} query rows but {seq_lens.numel()} seq_lens / {req_pool_indices.numel()} req_pool_indices"
        )
    rows = req_pool_indices.reshape(-1)[:bs].to(torch.long)
    lens = seq_lens.reshape(-1)[:bs].to(torch.long)
    enc = None if encoder_lens is None or encoder_lens.numel() == 0 else encoder_lens.reshape(-1)[:bs].to(torch.long)
    if is_cross_attn:
        if enc is None:
            raise ValueError("cross-attention decode needs encoder_lens")
        starts, lengths = torch.zeros_like(enc), enc
    else:
        starts = enc if enc is not None else torch.zeros_like(lens)
        lengths = lens
        if sliding_window_size > 0:
            skipped = (lengths - sliding_window_size).clamp_min(0)
            starts, lengths = starts + skipped, lengths - skipped

    q = query.to(torch.float32).reshape(bs, num_kv_heads, group, head_dim)
    sink = _sink_view(sinks, num_kv_heads, group)
    if sink is not None:
        sink = sink[None, :, :, None]

    per_token = num_kv_heads * (head_dim + head_dim_v)
    length_list = lengths.tolist()
    begin = 0
    while begin < bs:
        # Grow the chunk while its padded K/V gather stays under the element budget.
        end = begin + 1
        longest = length_list[begin]
        while end < bs:
            longest_next = max(longest, length_list[end])
            if (end + 1 - begin) * longest_next * per_token > _DECODE_CHUNK_ELEMENTS:
                break
            longest = longest_next
            end += 1
        cols = torch.arange(max(longest, 1), dtype=torch.long)
        visible = cols[None, :] < lengths[begin:end, None]
        positions = torch.where(visible, starts[begin:end, None] + cols[None, :], torch.zeros_like(cols)[None, :])
        slots = req_to_token[rows[begin:end, None], positions].to(torch.long)
        k = _scaled(k_cache[slots], key_scale)  # [b, L, Hkv, D]
        v = _scaled(v_cache[slots], value_scale)
        scores = _scores(q[begin:end], k, "bhgd,blhd->bhgl", sm_scale, logit_cap)
        weights = _softmax_with_sink(scores, visible[:, None, None, :], sink)
        out = torch.einsum("bhgl,blhd->bhgd", weights, v)
        output[begin:end] = out.reshape(end - begin, num_heads, head_dim_v).to(output.dtype)
        begin = end


def _tree_blocks(tree_mask: torch.Tensor, seq_lens: list[int], extend_lens: list[int]) -> list[torch.Tensor]:
    """Per-request `e x e` draft-to-draft visibility, from either SGLang tree-mask layout."""
    flat = tree_mask.reshape(-1)
    if flat.dtype != torch.bool:
        flat = flat != 0
    qlen_total = sum(e * e for e in extend_lens)
    full_total = sum(e * s for e, s in zip(extend_lens, seq_lens))
    blocks: list[torch.Tensor] = []
    offset = 0
    if flat.numel() == qlen_total:
        for e in extend_lens:
            blocks.append(flat[offset : offset + e * e].view(e, e))
            offset += e * e
    elif flat.numel() >= full_total:
        for e, s in zip(extend_lens, seq_lens):
            blocks.append(flat[offset : offset + e * s].view(e, s)[:, s - e :])
            offset += e * s
    else:
        raise ValueError(
            f"tree_mask has {flat.numel()} entries; expected {qlen_total} (QLEN_ONLY: extend_len^2 per "
            f"request) or >= {full_total} (FULL_MASK: extend_len * seq_len per request)"
        )
    return blocks


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    is_causal: bool = True,
) -> None:
    """Prefill/verify attention: each request's new tokens see its cached prefix (via
    req_to_token) plus the new tokens (causal, or `tree_mask` in speculative verify). The new
    tokens' K/V come from `k_extend`/`v_extend` (the backend has already cached them too)."""
    bs = extend_seq_lens.numel()
    if bs == 0 or q_extend.shape[0] == 0:
        return
    num_heads, head_dim = q_extend.shape[1], q_extend.shape[2]
    num_kv_heads = k_buffer.shape[-2]
    group = num_heads // num_kv_heads
    if group * num_kv_heads != num_heads:
        raise ValueError(f"query heads {num_heads} not a multiple of KV heads {num_kv_heads}")
    head_dim_v = v_buffer.shape[-1]

    lens = _as_list(seq_lens, bs)
    ext = _as_list(extend_seq_lens, bs)
    starts = _as_list(extend_start_loc, bs)
    rows = _as_list(req_pool_indices, bs)
    assert lens is not None and ext is not None and starts is not None and rows is not None
    enc = _as_list(encoder_lens, bs)
    if is_cross_attn and enc is None:
        raise ValueError("cross-attention extend needs encoder_lens")
    if max(ext) > max_len_extend > 0:
        raise ValueError(f"extend length {max(ext)} exceeds max_len_extend {max_len_extend}")
    blocks = _tree_blocks(tree_mask, lens, ext) if tree_mask is not None and not is_cross_attn else None
    sink = _sink_view(sinks, num_kv_heads, group)
    if sink is not None:
        sink = sink[:, :, None, None]

    for b in range(bs):
        e, start, row = ext[b], starts[b], rows[b]
        if e == 0:
            continue
        q = q_extend[start : start + e].to(torch.float32).reshape(e, num_kv_heads, group, head_dim)
        if is_cross_attn:
            assert enc is not None
            slots = req_to_token[row, : enc[b]].to(torch.long)
            k = _scaled(k_buffer[slots], key_scale)
            v = _scaled(v_buffer[slots], value_scale)
            visible = torch.ones(e, k.shape[0], dtype=torch.bool)
        else:
            prefix = lens[b] - e
            if prefix < 0:
                raise ValueError(f"request {b}: seq_len {lens[b]} < extend_len {e}")
            offset = enc[b] if enc is not None else 0
            # Prefix keys no query can see under the window are not gathered at all.
            first = max(0, prefix - sliding_window_size + 1) if sliding_window_size > 0 else 0
            slots = req_to_token[row, offset + first : offset + prefix].to(torch.long)
            if k_extend is not None and v_extend is not None:
                k_new, v_new = k_extend[start : start + e], v_extend[start : start + e]
            else:
                new_slots = req_to_token[row, offset + prefix : offset + prefix + e].to(torch.long)
                k_new, v_new = k_buffer[new_slots], v_buffer[new_slots]
            k = torch.cat([_scaled(k_buffer[slots], key_scale), k_new.to(torch.float32)])
            v = torch.cat([_scaled(v_buffer[slots], value_scale), v_new.to(torch.float32)])
            num_prefix = prefix - first
            visible = torch.ones(e, num_prefix + e, dtype=torch.bool)
            if blocks is not None:
                visible[:, num_prefix:] = blocks[b]
            elif is_causal:
                visible[:, num_prefix:] = torch.ones(e, e, dtype=torch.bool).tril()
            if sliding_window_size > 0:
                q_pos = torch.arange(prefix, prefix + e)
                k_pos = torch.arange(first, prefix + e)
                visible &= k_pos[None, :] > q_pos[:, None] - sliding_window_size
        scores = _scores(q, k, "qhgd,khd->hgqk", sm_scale, logit_cap)
        weights = _softmax_with_sink(scores, visible, sink)
        out = torch.einsum("hgqk,khd->qhgd", weights, v)
        o_extend[start : start + e] = out.reshape(e, num_heads, head_dim_v).to(o_extend.dtype)


def _op_defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def register_attention_ops() -> None:
    """Define and implement both ops for the CPU dispatch key; safe to call repeatedly. An op
    that already exists (e.g. from a real sgl-kernel CPU build) is left untouched."""
    global _library
    with _lock:
        if _library is not None:
            return
        library = torch.library.Library(NAMESPACE, "FRAGMENT")
        for name, schema, fn in (
            ("decode_attention_cpu", DECODE_SCHEMA, decode_attention_cpu),
            ("extend_attention_cpu", EXTEND_SCHEMA, extend_attention_cpu),
        ):
            if _op_defined(name):
                continue
            library.define(schema)
            library.impl(name, fn, "CPU")
        # The Library object owns the registrations: keep it alive for the process lifetime.
        _library = library
