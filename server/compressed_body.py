"""Compressed request bodies (`x-body-compressed: zstd`), opened at the worker's HTTP edge.

With SGLANG_ENABLE_REQUEST_DECOMPRESSION=1 SGLang opens such bodies in a middleware inside ours:
the SLO edge saw only compressed bytes, could not parse them and passed them on unchecked, with
a client's internal `slo_*` fields and an unvalidated SLO. Opened here first, every check sees
the JSON, and SGLang's middleware, finding no header, leaves the body alone. The output is
bounded, so a small compressed body cannot expand without limit in memory.
"""

from __future__ import annotations

import io

HEADER = b"x-body-compressed"
METHODS = ("zstd",)
CHUNK_BYTES = 1 << 20


class BodyError(ValueError):
    """A compressed body that cannot be opened; `status` is the HTTP answer (400 or 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def compression(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The method named by the request's x-body-compressed header, if any."""
    for key, value in headers:
        if key.lower() == HEADER:
            return value.decode("latin-1").strip()
    return None


def decompress(method: str, raw: bytes, limit: int) -> bytes:
    """The opened body; BodyError when the method is unknown, the data corrupt or the result
    larger than `limit` bytes."""
    if method not in METHODS:
        raise BodyError(400, f"must be one of {', '.join(METHODS)}, got {method!r}")
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw))
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = reader.read(CHUNK_BYTES)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except zstandard.ZstdError as e:
        raise BodyError(400, f"the body is not valid {method}: {e}") from None
    if size > limit:
        raise BodyError(413, f"the opened body is larger than {limit} bytes")
    return b"".join(chunks)


def without_compression(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    """The headers of the opened body: no compression header, its own content-length."""
    kept = [(k, v) for k, v in headers if k.lower() not in (HEADER, b"content-length")]
    return kept + [(b"content-length", str(length).encode())]
