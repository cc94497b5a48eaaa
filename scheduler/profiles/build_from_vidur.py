"""Build Llama-3-8B iteration-time profiles (H100, A100, A40) from Vidur's operator timings.

Usage (from the repo root):
    python -m scheduler.profiles.build_from_vidur [--data ../shared/data] [--out scheduler/profiles]

Per iteration: Vidur's measured per-layer linear/norm/activation operators × layers, plus the
embedding once, plus what Vidur lacks, modelled as a roofline from the GPU's datasheet (LM head,
decode attention, prefill attention) and a fixed per-iteration overhead. Where Vidur has no
Llama-3-8B table for a GPU, each Llama-2-7B operator is scaled by the ratio of the two models'
weights in that operator. All assumptions are spelled out in scheduler/profiles/README.md and
are written into every profile under "assumptions".
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from scheduler.core.perf_model import RooflinePerfModel, Sample, save_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
VIDUR_SUBDIR = "vidur-profiling/profiling/compute"
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    params: float

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim * 2 * self.layers  # K and V, fp16, every layer

    def op_weights(self) -> dict[str, float]:
        """Per-layer size of what each Vidur operator touches; the 7B→8B scaling ratio."""
        qkv = self.d_model * (self.heads + 2 * self.kv_heads) * self.head_dim
        rope = (self.heads + self.kv_heads) * self.head_dim
        return {
            "input_layernorm": self.d_model,
            "attn_pre_proj": qkv,
            "attn_rope": rope,
            "attn_post_proj": self.d_model * self.d_model,
            "post_attention_layernorm": self.d_model,
            "mlp_up_proj": 2 * self.d_model * self.ffn,
            "mlp_act": self.ffn,
            "mlp_down_proj": self.d_model * self.ffn,
            "add": self.d_model,
        }


LLAMA3_8B = ModelShape("Meta-Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8.03e9)
LLAMA2_7B = ModelShape("Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 32000, 6.74e9)


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s (datasheet)
    mem_bw: float  # HBM/GDDR bytes/s (datasheet)
    mem_bytes: float
    variant: str


GPUS = {
    "h100": Gpu("h100", 989e12, 3.35e12, 80e9, "H100 SXM5 80GB"),
    "a100": Gpu("a100", 312e12, 2.039e12, 80e9, "A100 SXM4 80GB"),
    "a40": Gpu("a40", 149.7e12, 696e9, 48e9, "A40 48GB"),
}

ASSUMPTIONS = {
    "dtype": "fp16/bf16 weights and KV cache, tensor parallel 1",
    "flops_efficiency": 0.5,  # share of peak FLOP/s reached by attention / LM-head GEMMs
    "bandwidth_efficiency": 0.7,  # share of peak bandwidth reached by decode attention / LM head
    "kernel_overhead_s": 5e-6,  # per attention kernel per layer
    "iteration_overhead_s": 2e-4,  # scheduling + sampling + launch outside the ops, per iteration
    "mem_fraction_static": 0.88,  # GPU memory for weights + KV cache (SGLang-style)
    "vidur_timing": "median of Vidur's CUDA-timed per-layer op timings, no CUDA graphs",
    "beyond_vidur_grid": "linear in tokens past the largest profiled num_tokens",
    "lm_head_tokens": "table: every batch token; samples: one logit row per decode request and per prefill chunk",
}

BATCH_AXIS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192]
KV_AXIS = [0, 1024, 4096, 16384, 65536, 131072, 262144, 524288, 1048576]


def read_linear_ops(path: Path, scale: dict[str, float] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(num_tokens grid, per-layer seconds, embedding seconds) from one Vidur mlp.csv, TP=1."""
    per_tokens: dict[int, list[tuple[float, float]]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            layer_ms = sum(float(row[f"time_stats.{op}.median"]) * (scale[op] if scale else 1.0) for op in LAYER_OPS)
            emb_ms = float(row["time_stats.emb.median"])
            per_tokens.setdefault(int(row["num_tokens"]), []).append((layer_ms, emb_ms))
    tokens = np.array(sorted(per_tokens), dtype=float)
    layer = np.array([np.mean([v[0] for v in per_tokens[int(n)]]) for n in tokens]) / 1000.0
    emb = np.array([np.mean([v[1] for v in per_tokens[int(n)]]) for n in tokens]) / 1000.0
    # Timer noise makes a few neighbours non-monotone; an iteration never gets cheaper with more tokens.
    return tokens, np.maximum.accumulate(layer), np.maximum.accumulate(emb)


class IterationModel:
    """Predicted seconds for one iteration on one GPU, from Vidur ops + roofline for the rest."""

    def __init__(self, gpu: Gpu, model: ModelShape, tokens: np.ndarray, layer_s: np.ndarray, emb_s: np.ndarray):
        self.gpu, self.model = gpu, model
        self.tokens, self.layer_s, self.emb_s = tokens, layer_s, emb_s

    def _interp(self, values: np.ndarray, n: float) -> float:
        top = self.tokens[-1]
        if n > top:
            return float(values[-1] * n / top)
        return float(np.interp(n, self.tokens, values))

    def linear(self, n: float) -> float:
        if n <= 0:
            return 0.0
        return self._interp(self.layer_s, n) * self.model.layers + self._interp(self.emb_s, n)

    def lm_head(self, rows: float) -> float:
        if rows <= 0:
            return 0.0
        a, m = ASSUMPTIONS, self.model
        weight_read = m.vocab * m.d_model * 2 / (self.gpu.mem_bw * a["bandwidth_efficiency"])
        compute = 2 * m.vocab * m.d_model * rows / (self.gpu.peak_flops * a["flops_efficiency"])
        return max(weight_read, compute) + a["kernel_overhead_s"]

    def decode_attention(self, kv_tokens: float) -> float:
        """Memory-bound: every cached K/V byte is read once per iteration."""
        a = ASSUMPTIONS
        read = kv_tokens * self.model.kv_bytes_per_token / (self.gpu.mem_bw * a["bandwidth_efficiency"])
        return read + self.model.layers * a["kernel_overhead_s"]

    def prefill_attention(self, chunk: float, context: float) -> float:
        """Compute-bound causal attention of `chunk` new tokens over `context` earlier ones:
        QK^T and PV are 2 FLOPs each per (query, key, head dim, head)."""
        if chunk <= 0:
            return 0.0
        m, a = self.model, ASSUMPTIONS
        pairs = chunk * (context + (chunk + 1) / 2)
        flops = 4 * pairs * m.heads * m.head_dim * m.layers
        return flops / (self.gpu.peak_flops * a["flops_efficiency"]) + m.layers * a["kernel_overhead_s"]

    def decode_step(self, batch: float, kv_tokens: float) -> float:
        """The table's view: `batch` new tokens, all sampled, attending `kv_tokens` in total."""
        if batch <= 0:
            return 0.0
        return (
            self.linear(batch)
            + self.lm_head(batch)
            + self.decode_attention(kv_tokens)
            + ASSUMPTIONS["iteration_overhead_s"]
        )

    def mixed_step(self, prefill: int, decode: int, decode_kv: int) -> float:
        """A chunked-prefill iteration: one fresh prefill chunk plus `decode` decoding requests."""
        rows = decode + (1 if prefill else 0)
        attn = (self.decode_attention(decode_kv) if decode else 0.0) + self.prefill_attention(prefill, 0)
        return self.linear(prefill + decode) + self.lm_head(rows) + attn + ASSUMPTIONS["iteration_overhead_s"]


def load_iteration_model(data_root: Path, gpu_name: str) -> tuple[IterationModel, str]:
    """The GPU's model, from Llama-3-8B timings when Vidur has them, else scaled Llama-2-7B."""
    gpu = GPUS[gpu_name]
    base = data_root / VIDUR_SUBDIR / gpu_name / "meta-llama"
    direct = base / LLAMA3_8B.name / "mlp.csv"
    if direct.exists():
        tokens, layer, emb = read_linear_ops(direct, None)
        source = f"vidur {gpu_name}/meta-llama/{LLAMA3_8B.name}/mlp.csv"
    else:
        w8, w7 = LLAMA3_8B.op_weights(), LLAMA2_7B.op_weights()
        tokens, layer, emb = read_linear_ops(
            base / LLAMA2_7B.name / "mlp.csv", {op: w8[op] / w7[op] for op in LAYER_OPS}
        )
        source = f"vidur {gpu_name}/meta-llama/{LLAMA2_7B.name}/mlp.csv scaled per op by 8B/7B weight ratio"
    return IterationModel(gpu, LLAMA3_8B, tokens, layer, emb), source


def profile_samples(model: IterationModel) -> list[Sample]:
    """A grid of decode-only, prefill-only and mixed iterations for the roofline fit."""
    samples = []
    for decode in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for ctx in (128, 512, 1024, 2048, 4096):
            samples.append(Sample(0, decode, decode * ctx, 0, model.mixed_step(0, decode, decode * ctx)))
    for chunk in (64, 128, 256, 512, 1024, 2048, 4096, 8192):
        for decode, ctx in ((0, 0), (8, 1024), (32, 1024), (64, 2048)):
            kv = decode * ctx + chunk
            samples.append(Sample(chunk, decode, kv, 0, model.mixed_step(chunk, decode, decode * ctx)))
    return samples


def build_profile(data_root: Path, gpu_name: str) -> dict:
    model, source = load_iteration_model(data_root, gpu_name)
    gpu, shape = model.gpu, model.model
    table = [[model.decode_step(b, kv) for kv in KV_AXIS] for b in BATCH_AXIS]
    samples = profile_samples(model)
    roofline = RooflinePerfModel.fit(samples, n_terms=2)
    kv_capacity = int(
        (gpu.mem_bytes * ASSUMPTIONS["mem_fraction_static"] - shape.params * 2) // shape.kv_bytes_per_token
    )
    return {
        "gpu": gpu.name,
        "gpu_variant": gpu.variant,
        "model": "llama3-8b",
        "model_shape": asdict(shape),
        "tp": 1,
        "source": source,
        "hardware": {"peak_flops": gpu.peak_flops, "mem_bw_bytes_s": gpu.mem_bw, "mem_bytes": gpu.mem_bytes},
        "assumptions": dict(ASSUMPTIONS),
        "kv_token_capacity": kv_capacity,
        "table": {
            "batch_tokens": BATCH_AXIS,
            "kv_tokens": KV_AXIS,
            "time_s": [[round(t, 7) for t in row] for row in table],
        },
        "roofline": {"terms": [{k: float(f"{v:.6g}") for k, v in t.items()} for t in roofline.to_dict()["terms"]]},
        "samples": [
            {
                "prefill_tokens": s.prefill_tokens,
                "decode_reqs": s.decode_reqs,
                "kv_tokens": s.kv_tokens,
                "spec_tokens": s.spec_tokens,
                "time_s": round(s.time_s, 7),
            }
            for s in samples
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=REPO_ROOT.parent / "shared" / "data", help="folder holding vidur-profiling/"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--gpus", nargs="+", default=sorted(GPUS), choices=sorted(GPUS))
    args = parser.parse_args(argv)
    for gpu_name in args.gpus:
        profile = build_profile(args.data, gpu_name)
        path = args.out / f"{gpu_name}-llama3-8b.json"
        save_profile(profile, path)
        t1 = profile["table"]["time_s"][0][1]
        print(f"{path}: decode batch 1 @1K ctx {t1 * 1000:.2f} ms ({profile['source']})")


if __name__ == "__main__":
    main()
