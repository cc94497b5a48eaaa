"""Turn a request (prompt text, lengths, app id, generated prefix) into a dense feature row.

Forests split on a few strong columns, so hashed TF-IDF text is compressed with a truncated SVD
(latent topics: "write code", "translate", "one-word answer") instead of thousands of sparse
columns. Hashing keeps the artifact free of a vocabulary; crc32 keeps app buckets stable across
processes (Python's `hash` is salted per process).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence

import numpy as np
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer

_NUMERIC_PROMPT = 7
_NUMERIC_GEN = 5
TAIL_CHARS = 300
_LIST_ITEM = re.compile(r"(?m)^\s*(?:[-*]|\d+[.)])\s")


def app_bucket(app_id: str | None, buckets: int) -> int:
    """Stable bucket for an app/program id; bucket 0 means "no app id"."""
    if not app_id:
        return 0
    return 1 + zlib.crc32(app_id.encode("utf-8")) % (buckets - 1)


def _prompt_numeric(text: str, prompt_len: int) -> list[float]:
    return [
        float(prompt_len),
        math.log1p(prompt_len),
        math.log1p(len(text)),
        float(text.count("\n")),
        float(text.count("?")),
        float(text.count("```")),
        float(len(_LIST_ITEM.findall(text))),
    ]


def _gen_numeric(text: str, generated: int) -> list[float]:
    return [
        float(generated),
        math.log1p(generated),
        float(text.count("\n")) / max(generated, 1),
        float(text.count("```") % 2),  # inside an open code block: more to come
        float(len(_LIST_ITEM.findall(text))),
    ]


class TopicModel:
    """Hashed TF-IDF compressed to a few SVD topics; an empty text maps to the zero vector."""

    def __init__(self, n_components: int, n_hash: int, seed: int) -> None:
        self.n_components = n_components
        self._hasher = HashingVectorizer(
            n_features=n_hash, alternate_sign=False, norm=None, ngram_range=(1, 2), lowercase=True
        )
        self._tfidf = TfidfTransformer(sublinear_tf=True)
        self._svd = TruncatedSVD(n_components=n_components, random_state=seed)
        self._fitted = False

    def fit(self, texts: Sequence[str]) -> TopicModel:
        texts = [t for t in texts if t]
        if not texts:
            return self  # nothing to learn from: transform() keeps returning zeros
        tfidf = self._tfidf.fit_transform(self._hasher.transform(texts))
        n_comp = min(self.n_components, max(1, tfidf.shape[0] - 1))
        self._svd.set_params(n_components=n_comp)
        self._svd.fit(tfidf)
        self._fitted = True
        return self

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.n_components))
        if self._fitted and any(texts):
            topics = self._svd.transform(self._tfidf.transform(self._hasher.transform(texts)))
            out[:, : topics.shape[1]] = topics
            out[[not t for t in texts]] = 0.0
        return out


class TextFeaturizer:
    """Separate topic models for prompts and generated text (their vocabularies differ), plus
    cheap numeric columns and a one-hot app bucket."""

    def __init__(
        self,
        n_components: int = 24,
        n_gen_components: int = 8,
        n_bag: int = 128,
        n_hash: int = 2**14,
        app_buckets: int = 16,
        seed: int = 0,
    ) -> None:
        self.app_buckets = app_buckets
        self.n_bag = n_bag
        # A small binary bag of hashed words: single words ("implement", "translate") that a
        # topic projection may blur but a tree can split on directly.
        self._bag = HashingVectorizer(n_features=n_bag, alternate_sign=False, binary=True, norm=None)
        # The same for the tail of the generated text, where "in summary" and the like show up.
        self.n_tail_bag = n_bag // 2
        self._tail_bag = HashingVectorizer(n_features=self.n_tail_bag, alternate_sign=False, binary=True, norm=None)
        self.prompt_topics = TopicModel(n_components, n_hash, seed)
        self.gen_topics = TopicModel(n_gen_components, n_hash, seed)
        self.fitted = False

    @property
    def width(self) -> int:
        return (
            _NUMERIC_PROMPT
            + self.app_buckets
            + self.n_bag
            + self.prompt_topics.n_components
            + self.gen_topics.n_components
            + self.n_tail_bag
            + _NUMERIC_GEN
        )

    def fit(self, prompt_texts: Sequence[str], generated_texts: Sequence[str] = ()) -> TextFeaturizer:
        self.prompt_topics.fit(prompt_texts)
        self.gen_topics.fit(generated_texts)
        self.fitted = True
        return self

    def transform(
        self,
        prompt_texts: Sequence[str],
        prompt_lens: Sequence[int],
        app_ids: Sequence[str | None],
        generated: Sequence[int],
        generated_texts: Sequence[str],
    ) -> np.ndarray:
        if not self.fitted:
            raise RuntimeError("TextFeaturizer.transform before fit")
        n = len(prompt_texts)
        apps = np.zeros((n, self.app_buckets))
        apps[np.arange(n), [app_bucket(a, self.app_buckets) for a in app_ids]] = 1.0
        prompt_num = np.array(
            [_prompt_numeric(t, p) for t, p in zip(prompt_texts, prompt_lens, strict=True)], dtype=float
        )
        gen_num = np.array([_gen_numeric(t, g) for t, g in zip(generated_texts, generated, strict=True)], dtype=float)
        return np.hstack(
            [
                prompt_num.reshape(n, _NUMERIC_PROMPT),
                apps,
                self._bag.transform(prompt_texts).toarray(),
                self.prompt_topics.transform(prompt_texts),
                self.gen_topics.transform(generated_texts),
                self._tail_bag.transform([t[-TAIL_CHARS:] for t in generated_texts]).toarray(),
                gen_num.reshape(n, _NUMERIC_GEN),
            ]
        )
