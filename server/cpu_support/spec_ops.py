"""Pure-torch ports of the `sgl_kernel` ops that SGLang's CPU speculative-decoding path calls.

SGLang's CPU spec path (EAGLE, EAGLE3, STANDALONE, multi-layer EAGLE, NGRAM) reaches these ops
through `sgl_kernel`, whose only PyPI builds are CUDA ones. Each function here has the name,
argument order and in-place/return contract of the op SGLang imports, so it can be served by
our `sgl_kernel` substitute. The behaviour follows the reference kernels SGLang ships for
other devices (the Triton kernels under `sglang/kernels/ops/speculative/`), including what
they leave untouched: callers pre-fill buffers (e.g. -1 links, -1 accept slots, all-true mask
prefixes) and the ops only write the cells the reference kernels write.

Trees and batches are small, so per-request Python loops are used where the reference walks a
tree; flat gathers and scatters are vectorised. All ops accept int32 or int64 index tensors and
write outputs in the output tensor's own dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# sglang.srt.speculative.eagle_utils.TreeMaskMode values (kept numeric: that enum lives in
# SGLang, and the op receives a plain int-like value).
FULL_MASK = 0
QLEN_ONLY = 1


def _flat_long(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).to(torch.long)


def _segment_offsets(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For per-row lengths, the row id and in-row offset of every element of the packed rows."""
    if bool((lengths < 0).any()):
        raise ValueError("negative segment length (end offset before start offset)")
    rows = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    within = torch.arange(rows.numel()) - starts[rows]
    return rows, within


# --- tree building / verification --------------------------------------------------------------


def _draft_parents(parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int) -> torch.Tensor:
    """Parent node of every draft node 1..n of each request's tree, as a (bs, n) tensor.

    Node i (1-based) is the draft candidate selected_index[:, i - 1]; candidate c was expanded
    from the candidate parent_list[:, c // topk] (c // topk == 0 means the root, node 0). The
    parent node is the position of that candidate in selected_index plus one, or -1 when it was
    not selected (a malformed tree: the reference kernels then skip the link and stop the walk).
    """
    sel = selected_index.to(torch.long)
    bs, n = sel.shape
    tb = sel // topk
    parents = torch.zeros((bs, n), dtype=torch.long)
    from_root = tb == 0
    if bool(from_root.all()):
        return parents  # e.g. one draft step: parent_list is (bs, 0) and never read
    plist = parent_list.reshape(bs, -1).to(torch.long)
    parent_token = torch.gather(plist, 1, tb.clamp(0, plist.shape[1] - 1))
    match = sel.unsqueeze(1) == parent_token.unsqueeze(2)  # [b, i, p]: candidate p is i's parent
    found = match.any(-1)
    first = match.to(torch.int8).argmax(-1)  # first matching position, as the kernels scan
    parents = torch.where(found, first + 1, torch.full_like(first, -1))
    return torch.where(from_root, torch.zeros_like(parents), parents)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build each request's EAGLE draft tree in place: attention mask, positions and links.

    Node 0 is the bonus (root) token, node i the selected draft candidate selected_index[:, i-1].
    Writes retrive_index (flat node ids), retrive_next_token (first child) and
    retrive_next_sibling (next sibling; both pre-filled with -1 by the caller), positions
    (seq_len + depth of the node) and the tree block of tree_mask: row i attends the root and
    its ancestors. FULL_MASK lays rows out as [seq_len prefix | tree block] per request (the
    caller pre-fills the prefix with True); QLEN_ONLY stores just the draft_token_num-square
    block per request.
    """
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(
            f"build_tree_kernel_efficient_cpu supports FULL_MASK (0) and QLEN_ONLY (1), got {mode}"
        )
    n = draft_token_num
    bs = verified_seq_len.numel()
    if bs == 0:
        return
    seq_lens = _flat_long(verified_seq_len)
    parents = _draft_parents(parent_list, selected_index, topk)  # (bs, n - 1)

    # Links: nodes are pushed to the front of their parent's child list from the last node to
    # the first, so children end up in ascending order (first child = smallest index).
    next_token = retrive_next_token.reshape(bs, n).tolist()
    next_sibling = retrive_next_sibling.reshape(bs, n).tolist()
    for b, row in enumerate(parents.tolist()):
        for i in range(n - 1, 0, -1):
            parent = row[i - 1]
            if parent < 0:
                continue
            previous = next_token[b][parent]
            next_token[b][parent] = i
            if previous != -1:
                next_sibling[b][i] = previous
    retrive_next_token.copy_(torch.tensor(next_token).view_as(retrive_next_token))
    retrive_next_sibling.copy_(torch.tensor(next_sibling).view_as(retrive_next_sibling))
    node_ids = torch.arange(bs * n).view(bs, n)
    retrive_index.copy_(node_ids.view_as(retrive_index))

    # Mask and depth: walk from each node towards the root, at most `depth` steps.
    parent_of = torch.cat([torch.zeros((bs, 1), dtype=torch.long), parents], dim=1)  # by node id
    block = torch.zeros((bs, n, n), dtype=torch.bool)
    block[:, :, 0] = True
    steps = torch.zeros((bs, n), dtype=torch.long)
    node = torch.arange(n).expand(bs, n).clone()
    active = node > 0
    batch_ids = torch.arange(bs).unsqueeze(1).expand(bs, n)
    row_ids = torch.arange(n).expand(bs, n)
    for _ in range(depth):
        if not bool(active.any()):
            break
        steps += active.long()
        block[batch_ids[active], row_ids[active], node[active]] = True
        up = torch.gather(parent_of, 1, node)
        active = active & (up > 0)
        node = torch.where(active, up, node)
    positions.view(bs, n).copy_(seq_lens.unsqueeze(1) + steps)

    flat_mask = tree_mask.view(-1)
    if mode == QLEN_ONLY:
        flat_mask[: bs * n * n].view(bs, n, n).copy_(block)
        return
    start = 0
    for b, seq_len in enumerate(seq_lens.tolist()):
        width = seq_len + n
        flat_mask[start : start + n * width].view(n, width)[:, seq_len:].copy_(block[b])
        start += n * width


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy-verify each request's draft tree in place.

    From the root, repeatedly descend to the first child whose draft token equals the target
    model's token at the last accepted node, for at most accept_index.shape[1] - 1 levels.
    Writes accept_index[b, :k + 1] (flat ids of the root and the k accepted nodes; the rest
    keep the caller's -1), accept_token_num[b] = k, and predicts at each accepted node (its
    target token, i.e. the next token); the last accepted node's target token is the bonus.
    """
    bs, num_draft = candidates.shape
    if bs == 0:
        return
    num_steps = accept_index.shape[1]
    cand = candidates.tolist()
    index = retrive_index.reshape(bs, num_draft).tolist()
    first_child = retrive_next_token.reshape(bs, num_draft).tolist()
    sibling = retrive_next_sibling.reshape(bs, num_draft).tolist()
    target = target_predict.reshape(-1).tolist()
    accepted = accept_index.tolist()
    counts: list[int] = []
    predicted: dict[int, int] = {}
    for b in range(bs):
        last = index[b][0]
        accepted[b][0] = last
        count = 0
        cur = 0
        for _ in range(1, num_steps):
            cur = first_child[b][cur]
            want = target[last]
            matched = False
            for _ in range(num_draft):  # bounded like the reference, even on a malformed tree
                if cur == -1:
                    break
                if cand[b][cur] == want:
                    predicted[last] = want
                    count += 1
                    last = index[b][cur]
                    accepted[b][count] = last
                    matched = True
                    break
                cur = sibling[b][cur]
            if not matched:
                break
        counts.append(count)
        predicted[last] = target[last]
    if predicted:
        where = torch.tensor(list(predicted.keys()), dtype=torch.long)
        predicts.view(-1)[where] = torch.tensor(list(predicted.values())).to(predicts.dtype)
    accept_index.copy_(torch.tensor(accepted).to(accept_index.dtype))
    accept_token_num.copy_(torch.tensor(counts, dtype=torch.long).to(accept_token_num.dtype))


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Recover tree positions and links from an NGRAM ancestor mask, in place.

    tree_mask[b, i, j] (flat, batch_size * n * n) marks node j as an ancestor of node i (the
    diagonal is ignored). Node i's position is seq_len + its number of ancestors, its parent is
    its largest ancestor below it, its first child the smallest later node it is an ancestor
    of, and its next sibling the smallest later node with the same parent (-1 when none).
    """
    bs, n = batch_size, draft_token_num
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).to(torch.bool)
    ids = torch.arange(n)
    earlier = ids.unsqueeze(0) < ids.unsqueeze(1)  # [i, j]: j < i
    later = earlier.T  # [i, k]: k > i
    ancestors = mask & earlier
    depth = ancestors.sum(-1)
    parent = torch.where(ancestors.any(-1), (ancestors * ids).argmax(-1), torch.full((bs, n), -1))

    def first_true(m: torch.Tensor) -> torch.Tensor:
        return torch.where(m.any(-1), m.to(torch.int8).argmax(-1), torch.full((bs, n), -1))

    descendants = mask.transpose(1, 2) & later  # [b, i, k]: i is an ancestor of k > i
    same_parent = (parent.unsqueeze(2) == parent.unsqueeze(1)) & (parent >= 0).unsqueeze(2) & later

    seq_lens = _flat_long(verified_seq_len)[:bs]
    positions.view(-1)[: bs * n].copy_((depth + seq_lens.unsqueeze(1)).view(-1))
    retrive_index.copy_(torch.arange(bs * n).view_as(retrive_index))
    retrive_next_token.copy_(first_true(descendants).view_as(retrive_next_token))
    retrive_next_sibling.copy_(first_true(same_parent).view_as(retrive_next_sibling))


# --- KV cache locations ------------------------------------------------------------------------


def _check_pool_len(req_to_token: torch.Tensor, pool_len: int) -> None:
    if req_to_token.dim() != 2 or req_to_token.shape[1] != pool_len:
        raise ValueError(f"req_to_token must be (rows, {pool_len}), got {tuple(req_to_token.shape)}")


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather each request's KV slots req_to_token[row, start:end] into out_cache_loc, packed
    request after request; entries past the total are left as they were."""
    _check_pool_len(req_to_token, pool_len)
    starts = _flat_long(start_offset)
    rows, within = _segment_offsets(_flat_long(end_offset) - starts)
    if rows.numel() == 0:
        return
    table_rows = _flat_long(req_pool_indices)[rows]
    values = req_to_token[table_rows, starts[rows] + within]
    out_cache_loc.view(-1)[: rows.numel()] = values.to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Read back the topk * num_steps draft KV slots each request reserved right after its
    prefix (req_to_token[row, seq_len : seq_len + topk * num_steps]) into out_cache_loc."""
    _check_pool_len(req_to_token, pool_len)
    bs = req_pool_indices.numel()
    cols = _flat_long(seq_lens).unsqueeze(1) + torch.arange(topk * num_steps)
    values = req_to_token[_flat_long(req_pool_indices).unsqueeze(1), cols]
    out_cache_loc.view(-1)[: bs * topk * num_steps] = values.reshape(-1).to(out_cache_loc.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Compact the KV slots of accepted tokens: the k-th accept_index entry that is not -1
    (flat order, first `size` entries) writes out_cache_loc[that index] to position k."""
    flat = _flat_long(accept_index)
    if size is not None:
        flat = flat[:size]
    kept = flat != -1
    dst = torch.cumsum(kept.long(), 0) - kept.long()
    valid = flat > -1
    values = out_cache_loc.view(-1)[flat[valid]]
    accept_out_cache_loc.view(-1)[dst[valid]] = values.to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """bonus_tokens[b] = the last accepted token of request b, i.e. flat accept_tokens at
    b * accept_stride + accept_lens[b] - 1 (accept_lens counts the bonus)."""
    lens = _flat_long(accept_lens)
    where = torch.arange(lens.numel()) * accept_stride + lens - 1
    bonus_tokens.view(-1)[: lens.numel()] = accept_tokens.reshape(-1)[where].to(bonus_tokens.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Per-branch req->token rows for multi-step draft decode, as a new (bs * topk, pool_len)
    table: row b * topk + t is request b's prefix followed by branch t's draft slots (laid out
    at seq_len + t * num_steps by assign_draft_cache_locs_contiguous). Only the first
    seq_len + num_steps entries of a row are meaningful."""
    _check_pool_len(req_to_token, pool_len)
    rows = req_to_token[_flat_long(req_pool_indices)]
    lens = _flat_long(seq_lens).repeat_interleave(topk).unsqueeze(1)
    branch = torch.arange(topk).repeat(rows.shape[0]).unsqueeze(1)
    expanded = rows.repeat_interleave(topk, dim=0)
    step = torch.arange(num_steps)
    drafts = torch.gather(expanded, 1, lens + branch * num_steps + step)
    expanded.scatter_(1, lens + step, drafts)
    return expanded


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Advance each request's extend window by one token, in place: shift
    input_ids[start : start + len] left by one and write the new draft token topk_index[b]
    at the window's end (or at input_ids[select_index[b]] when given); empty windows are left
    alone."""
    starts = _flat_long(extend_start_loc)
    lens = _flat_long(extend_seq_lens)
    flat = input_ids.view(-1)
    rows, within = _segment_offsets((lens - 1).clamp(min=0))
    if rows.numel():
        dst = starts[rows] + within
        flat[dst] = flat[dst + 1]  # the gather copies before the scatter writes
    nonempty = lens > 0
    if select_index is not None:
        last = _flat_long(select_index)
    else:
        last = starts + lens - 1
    new_tokens = topk_index.reshape(-1)[: lens.numel()]
    flat[last[nonempty]] = new_tokens[nonempty].to(flat.dtype)


SPEC_OPS: dict[str, Callable[..., Any]] = {
    "verify_tree_greedy_cpu": verify_tree_greedy_cpu,
    "build_tree_kernel_efficient_cpu": build_tree_kernel_efficient_cpu,
    "reconstruct_indices_from_tree_mask": reconstruct_indices_from_tree_mask,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
    "assign_draft_cache_locs_contiguous_cpu": assign_draft_cache_locs_contiguous_cpu,
    "fill_bonus_tokens_cpu": fill_bonus_tokens_cpu,
    "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    "build_draft_decode_metadata_cpu": build_draft_decode_metadata_cpu,
    "rotate_input_ids_cpu": rotate_input_ids_cpu,
}
