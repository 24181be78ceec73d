"""Model FLOPs per token and MFU: counted from the model, against a table of dense bf16 peaks."""
from __future__ import annotations

import pytest
import torch.nn as nn

from trainer.loop.flops import flops_per_token, mfu, peak_flops
from trainer.loop.model import PRESETS, build_gpt


@pytest.mark.parametrize("name,tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("NVIDIA A10G", 125.0),
    ("Tesla V100-SXM2-16GB", 125.0)])
def test_peaks_of_the_table_by_device_name(name, tflops):
    assert peak_flops(name) == tflops * 1e12


def test_no_peak_on_cpu_or_an_unknown_device():
    assert peak_flops(None) is None and peak_flops("Some Future GPU") is None
    assert mfu(1e6, 1e9, None) is None


def test_gpt_flops_are_six_per_matmul_weight_plus_attention():
    cfg = PRESETS["gpt-small"]
    d, layers, t, vocab = cfg.n_embd, cfg.n_layer, cfg.block_size, cfg.vocab_size
    per_block = 3 * d * d + d * d + 4 * d * d + 4 * d * d  # qkv, proj, mlp up, mlp down
    expected = 6 * (layers * per_block + d * vocab) + 12 * layers * d * t  # + the (tied) head
    assert flops_per_token(build_gpt("gpt-small"), t) == expected


def test_a_user_model_counts_its_linears_or_says_its_own():
    assert flops_per_token(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), 1) == 6 * (32 + 16)

    class Own(nn.Module):
        def flops_per_token(self, seq_len):
            return 42.0 * seq_len

    assert flops_per_token(Own(), 10) == 420.0


def test_mfu_is_achieved_over_peak():
    fpt = flops_per_token(build_gpt("gpt-tiny"), 32)
    assert mfu(1000.0, fpt, 1e12) == pytest.approx(1000.0 * fpt / 1e12)
