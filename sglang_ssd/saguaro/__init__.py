"""Saguaro: the pure-torch math of speculative speculative decoding (SSD).

Kumar, Dao, May, "Speculative Speculative Decoding", ICLR 2026, arXiv 2603.03251; DESIGN.md
section 1 holds the exact rules and the corrected formulas. No processes, no SGLang: this package
imports with torch alone and runs on CPU or CUDA tensors (device follows the inputs).
"""

from .acceptance import AcceptanceCounts, alpha_from_accept_length, expected_accept_length
from .backups import NgramSpeculator, RandomSpeculator
from .cache import CacheLookup, SparseProbs, SpeculationCache
from .fallback import Backup, BackupStats, FallbackPolicy
from .fanout import fit_hit_counts, fit_hit_model, geometric_fanout, hit_rate, uniform_fanout
from .sampling import (
    SamplingBatch,
    apply_sampling,
    filter_order,
    saguaro_probs,
    top_m_from_fanout,
)
from .speedup import expected_speedup
from .uniforms import VerifyUniforms
from .verify import VerifyResult, verify

__all__ = [
    "AcceptanceCounts",
    "Backup",
    "BackupStats",
    "CacheLookup",
    "FallbackPolicy",
    "NgramSpeculator",
    "RandomSpeculator",
    "SamplingBatch",
    "SparseProbs",
    "SpeculationCache",
    "VerifyResult",
    "VerifyUniforms",
    "alpha_from_accept_length",
    "apply_sampling",
    "expected_accept_length",
    "expected_speedup",
    "filter_order",
    "fit_hit_counts",
    "fit_hit_model",
    "geometric_fanout",
    "hit_rate",
    "saguaro_probs",
    "top_m_from_fanout",
    "uniform_fanout",
    "verify",
]
