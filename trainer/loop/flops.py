"""Model FLOPs per token and model FLOPs utilisation (MFU): pure functions and the table of peaks.

FLOPs per token are counted from the model, as in the PaLM paper's appendix B: 6 per weight of every
matrix multiply (nn.Linear: forward 2, backward 4; embedding lookups are not multiplies), plus attention's
score and value products, 12 * layers * width * context, for a model whose `config` names them (the
built-in GPT; a user model may define `flops_per_token(seq_len)` instead). Activation recomputation is
not counted: MFU is model FLOPs, not hardware FLOPs.

MFU = tokens/s per GPU * FLOPs per token / the GPU's dense bf16 (fp16 where no bf16) tensor peak.
"""
from __future__ import annotations

import torch.nn as nn

TFLOP = 1e12

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' datasheets; fp16 for the V100,
# which has no bf16. Matched as substrings of torch.cuda.get_device_name(), first match wins, so the
# more specific names come first (an H100 PCIe before an H100 SXM, an L40S before an L4).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM5
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 125.0),  # the A10's datasheet figure (AWS publishes none for its A10G)
    ("V100", 125.0),  # fp16
)


def peak_flops(device_name: str | None) -> float | None:
    """The device's dense bf16/fp16 peak in FLOP/s, or None when unknown (and on CPU: device_name None)."""
    if not device_name:
        return None
    for key, tflops in PEAK_TFLOPS:
        if key in device_name:
            return tflops * TFLOP
    return None


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token of a sequence of seq_len tokens, counted from the model."""
    own = getattr(model, "flops_per_token", None)
    if callable(own):
        return float(own(seq_len))
    matmul_weights = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    flops = 6.0 * matmul_weights
    cfg = getattr(model, "config", None)
    layers, width = getattr(cfg, "n_layer", None), getattr(cfg, "n_embd", None)
    if isinstance(layers, int) and isinstance(width, int):
        flops += 12.0 * layers * width * seq_len
    return flops


def mfu(tokens_per_s_per_gpu: float, flops_per_tok: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (0..1), or None without a known peak."""
    if not peak:
        return None
    return tokens_per_s_per_gpu * flops_per_tok / peak
