"""The SGLang internals sglang-slo relies on (see sglang_contract.py for the kinds of entries).

Grouped by the part of ours that uses them; `why` says what breaks without it.
"""

from __future__ import annotations

from scheduler.core.sampling_guard import CHECKS
from server.cpu_support.pd_transfer import MOONCAKE_CONN
from server.cpu_support.sgl_kernel_substitute import IMPLEMENTED, SUBMODULES
from tests.contract.sglang_contract import CallArity, Entry, Exists, Fields, ImportsFrom, Reads, SetsAttrs, Takes

SCHED = "sglang.srt.managers.scheduler"
BATCH = "sglang.srt.managers.schedule_batch"
TM = "sglang.srt.managers.tokenizer_manager"
ARGS = "sglang.srt.server_args"
RT = "sglang.srt.runtime_context"
AMX = "sglang.srt.layers.attention.intel_amx_backend"
ADAPTIVE = "sglang.srt.speculative.adaptive_runtime_state"

# The scheduler process (scheduler/sglang_scheduler.py and its mixins): the methods we override or
# call, and the extension points we plug into.
SCHEDULER: list[Entry] = [
    Takes(SCHED, "Scheduler.process_input_requests", ("recv_reqs",), "the SLO intake (parsing SLOs, arrivals)"),
    Takes(SCHED, "Scheduler.handle_generate_request", ("recv_req",), "per-request SLO state"),
    Exists(SCHED, "Scheduler.get_output_streamer_class", "token timestamps for TPOT accounting"),
    Exists(SCHED, "Scheduler.get_prefill_adder_class", "the policy's admission into a prefill batch"),
    Takes(SCHED, "Scheduler.get_new_batch_prefill", ("running_batch",), "the SLO policy's pass"),
    Takes(SCHED, "Scheduler.update_running_batch", ("batch",), "preemption and decode planning"),
    Exists(SCHED, "Scheduler.run_batch", "step timing for the learned performance model"),
    Takes(SCHED, "Scheduler.process_batch_result", ("batch", "result"), "finished requests and acceptance"),
    Exists(SCHED, "Scheduler.maybe_init_draft_worker", "SLO-adaptive speculation attaches here"),
    Takes(SCHED, "Scheduler._add_request_to_queue", ("req", "is_retracted"), "queue bounds and ordering"),
    Takes(SCHED, "Scheduler._abort_on_queued_limit", ("recv_req",), "the queued-tokens bound (429)"),
    Takes(
        SCHED,
        "Scheduler.get_num_allocatable_reqs",
        ("running_bs", "beam_width", "running_batch", "num_held_rows"),
        "how many requests a prefill pass may add",
    ),
    SetsAttrs(
        SCHED,
        "Scheduler",
        (
            "waiting_queue",
            "running_batch",
            "chunked_req",
            "last_batch",
            "tree_cache",
            "token_to_kv_pool_allocator",
            "tp_worker",
            "draft_worker",
            "enable_overlap",
            "forward_stream",
            "is_mixed_chunk",
            "chunked_prefill_size",
            "page_size",
            "max_running_requests",
            "max_total_num_tokens",
            "max_queued_requests",
            "send_abort_output",
            "release_aborted_prefill_waiting_req",
            "_release_aborted_request",
        ),
        "the scheduler state the adapter plans with and acts on (queues, KV pool, step timing, aborts)",
    ),
    Exists(SCHED, "NextBatchPlan", "what get_new_batch_prefill returns"),
    Exists(SCHED, "run_scheduler_process", "our scheduler process runs SGLang's with our class"),
    Exists(
        "sglang.srt.disaggregation.decode",
        "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
        "PD decode admission",
    ),
    Exists("sglang.srt.disaggregation.utils", "DisaggregationMode", "the PD role of a worker"),
    Exists(BATCH, "FINISH_ABORT", "shed and dropped requests are aborted with a reason"),
    Exists(BATCH, "ReqKvInfo.holds_kv", "a retraction frees only requests that hold KV"),
    SetsAttrs(
        BATCH,
        "Req",
        ("rid", "origin_input_ids", "output_ids", "sampling_params", "finished_reason", "prefix_len", "kv"),
        "the request view the policy plans with (prompt, generated, cached prefix)",
    ),
    SetsAttrs(BATCH, "Req", ("is_retracted", "customized_info"), "retraction state; per-request info to the client"),
    SetsAttrs(
        BATCH, "Req", ("extend_end",), "a prefill step extends [prefix_len, extend_end) (the perf model's shape)"
    ),
    Fields(BATCH, "ScheduleBatch", ("reqs", "forward_mode", "decoding_reqs"), "a step's shape for the perf model"),
    SetsAttrs(BATCH, "ReqKvInfo", ("req_pool_idx",), "whether a request holds a KV row (preemption)"),
    Exists(BATCH, "Req.finished", "finished requests leave the plan"),
    Exists(RT, "get_parallel", "tensor/data-parallel ranks (the leading rank plans, the others follow)"),
    Takes(
        "sglang.srt.utils", "broadcast_pyobj", ("data", "rank", "dist_group", "src"), "the plan reaches every TP rank"
    ),
]

# The HTTP process (server/sglang_http.py) and the launcher (launch/).
HTTP: list[Entry] = [
    Takes(
        "sglang.srt.entrypoints.http_server",
        "launch_server",
        ("server_args", "init_tokenizer_manager_func", "run_scheduler_process_func"),
        "our tokenizer manager and scheduler process are swapped in through these hooks",
    ),
    Exists("sglang.srt.entrypoints.http_server", "app", "our ASGI middleware (SLOs, status, keys) wraps SGLang's app"),
    Exists("sglang.srt.entrypoints.engine", "init_tokenizer_manager", "builds our TokenizerManager subclass"),
    Takes(TM, "TokenizerManager.generate_request", ("obj", "request"), "SLO reports and delta streams"),
    Takes(TM, "TokenizerManager._handle_abort_finish_reason", ("out", "state", "is_stream"), "shed answers (429/503)"),
    Takes(
        TM,
        "TokenizerManager._validate_one_request",
        ("obj", "input_ids"),
        "an empty prompt is a 400, not a dead scheduler",
    ),
    Exists(TM, "TokenizerManager.auto_create_handle_loop", "our drain handler must win over SGLang's SIGTERM handler"),
    Exists("sglang.srt.managers.io_struct", "GenerateReqInput", "the fields a native request may carry"),
    Fields(
        "sglang.srt.sampling.sampling_params",
        "SamplingParams",
        tuple(CHECKS),
        "the sampling parameters our guard checks before SGLang builds SamplingParams(**params)",
    ),
    Exists("sglang.srt.managers.io_struct", "AbortReq", "aborting a request from the adapter"),
    Exists("sglang.srt.environ", "envs.SGLANG_ENABLE_REQUEST_DECOMPRESSION", "compressed request bodies"),
    Exists(ARGS, "ServerArgs.add_cli_args", "the launcher takes every SGLang flag"),
    Exists(ARGS, "ServerArgs.from_cli_args", "the launcher builds SGLang's record"),
    Exists(ARGS, "ServerArgs.resolve_once", "PD prefill sizing reads SGLang's resolved chunk"),
    Takes("sglang.srt.arg_groups.overrides", "resolution_result", ("server_args", "field"), "resolved values"),
    Fields(
        ARGS,
        "ServerArgs",
        (
            "chunked_prefill_size",
            "attn_dp_size",
            "dp_size",
            "tp_size",
            "pp_size",
            "disaggregation_mode",
            "disaggregation_transfer_backend",
            "disaggregation_bootstrap_port",
            "schedule_policy",
            "enable_mixed_chunk",
            "speculative_algorithm",
            "speculative_num_steps",
            "speculative_eagle_topk",
            "speculative_num_draft_tokens",
            "max_queued_requests",
            "max_total_tokens",
            "attention_backend",
            "device",
            "model_path",
            "host",
            "port",
            "api_key",
            "log_level",
        ),
        "flags the launcher reads or sets",
    ),
]

# CPU support (server/cpu_support): the platform fact we state, the backend our ops serve, and the
# sgl_kernel names SGLang's CPU path imports (each must be one our substitute provides).
_SERVED_OPS = frozenset(IMPLEMENTED)
CPU: list[Entry] = [
    Takes(RT, "override_platform", ("facts",), "CPU speculation keeps the intel_amx backend (has_amx=True)"),
    Exists(RT, "get_platform", "SGLang asks has_amx before rewriting intel_amx to torch_native"),
    Exists(AMX, "IntelAMXAttnBackend", "the CPU speculation backend our attention ops serve"),
    Exists(AMX, "IntelAMXMultiStepDraftBackend", "draft decoding on CPU"),
    CallArity(AMX, "IntelAMXAttnBackend", "forward_extend", "extend_attention_fwd", 22, "our extend_attention_cpu"),
    CallArity(AMX, "IntelAMXAttnBackend", "forward_decode", "decode_attention_fwd", 19, "our decode_attention_cpu"),
    ImportsFrom("sglang.srt.mem_cache.allocation", "sgl_kernel", _SERVED_OPS, "CPU serving writes req_to_token"),
    ImportsFrom("sglang.kernels.ops.speculative.cache_locs", "sgl_kernel", _SERVED_OPS, "CPU speculation"),
    ImportsFrom("sglang.kernels.ops.speculative.spec_tree", "sgl_kernel", _SERVED_OPS, "CPU speculation"),
    ImportsFrom("sglang.kernels.ops.speculative.eagle", "sgl_kernel", _SERVED_OPS, "CPU speculation"),
    ImportsFrom("sglang.kernels.ops.speculative.multi_layer_eagle", "sgl_kernel", _SERVED_OPS, "CPU speculation"),
    ImportsFrom(AMX, "sgl_kernel", _SERVED_OPS, "CPU draft decoding"),
    ImportsFrom(
        "sglang.kernels.ops.speculative.reconstruct_tree",
        "sgl_kernel.speculative",
        frozenset(SUBMODULES["speculative"]),
        "NGRAM on CPU",
    ),
]

# PD disaggregation on CPU (server/cpu_support/pd_transfer.py, launch/launch_argv.py): the sender switch
# that keeps a prefill's KV send off pinned memory and CUDA events, and the decode retraction backup.
PD_CPU: list[Entry] = [
    Exists(MOONCAKE_CONN, "MooncakeKVSender.supports_host_tensor_indices", "the switch we turn off on CPU"),
    Reads(
        "sglang.srt.disaggregation.prefill",
        "SchedulerDisaggregationPrefillMixin._send_kv_chunk",
        "supports_host_tensor_indices",
        "a CPU prefill would allocate pinned memory and a CUDA event for every KV send and crash",
    ),
    Fields(
        ARGS,
        "ServerArgs",
        ("disaggregation_decode_retraction_backup",),
        "CPU decode workers keep retracted KV in CPU tensors, not a HiCache host pool",
    ),
]

# Speculation (scheduler/sglang_speculation.py): our length policy plugs into SGLang's controller.
SPECULATION: list[Entry] = [
    Takes(ADAPTIVE, "AdaptiveController.__init__", ("worker", "policy"), "SloSpeculation is the controller's policy"),
    Exists(ADAPTIVE, "AdaptiveSpecPolicy", "the protocol SloSpeculation implements"),
    Exists("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2.init_cuda_graphs", "builds one state per length"),
    SetsAttrs(
        "sglang.srt.speculative.eagle_worker_v2",
        "EAGLEWorkerV2",
        ("adaptive_controller", "speculative_num_steps", "_draft_worker"),
        "the controller we install, the length in force, the draft worker",
    ),
    SetsAttrs(
        "sglang.srt.speculative.eagle_worker_v2",
        "EagleDraftWorker",
        ("draft_runner",),
        "the draft model's weights give a draft step's cost relative to the target's",
    ),
]

CONTRACT: list[Entry] = SCHEDULER + HTTP + CPU + PD_CPU + SPECULATION

# SamplingParams fields our sampling guard does not accept from clients: SGLang's internal ones,
# and beam search (not offered through this server). A field outside CHECKS and this set is new
# in SGLang: a request carrying it (an OpenAI route may send it as null) would be refused.
SAMPLING_FIELDS_NOT_FROM_CLIENTS = frozenset(
    {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized",
     "ebnf_full_assistant", "beam_width"}
)  # fmt: skip
