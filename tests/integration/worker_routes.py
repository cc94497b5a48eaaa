"""The worker's routes as its tests expect them, written down independently of the code's own
table (server/worker_access.py), so that a route moving between roles there fails a test."""

# Routes a client of the model may call.
CLIENT_PATHS = frozenset(
    {
        "/generate", "/encode", "/classify", "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
        "/v1/classify", "/v1/score", "/v1/rerank", "/v1/responses", "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel", "/v1/messages", "/v1/messages/count_tokens",
        "/v1/audio/transcriptions", "/api/chat", "/api/generate", "/api/show", "/api/tags", "/tokenize",
        "/v1/tokenize", "/detokenize", "/v1/detokenize", "/parse_function_call", "/separate_reasoning",
        "/open_session", "/close_session", "/get_model_info", "/model_info", "/v1/models", "/v1/models/{model}",
        "/server_info", "/get_server_info", "/weight_version", "/get_weight_version", "/", "/ping",
        "/invocations", "/vertex_generate",
    }
)  # fmt: skip
# Routes anyone may call (load balancers' health checks).
OPEN_PATHS = frozenset({"/health", "/health_generate"})
