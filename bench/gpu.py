"""The GPU benchmark behind bench/gpu.sh: MFU and tokens/s per GPU of the ~350M GPT in bf16, DDP vs FSDP, compile
off and on; checkpoint blocking seconds of background (DCP) saves; peak GPU memory. Writes one JSON file.

Each configuration is a real `python -m trainer train` run in its own process (one GPU, so no torchrun),
on the synthetic dataset, with periodic sharded checkpoints to a temporary directory. Figures are
medians over the steps after the first WARMUP (which hold compilation and allocator warmup); the
blocking seconds are the largest of the saves after the first (which allocates the pinned buffers),
and the first's are reported apart.

Needs only the Python standard library, PyTorch and numpy: run from a clone with PYTHONPATH set to it.
`--device cpu` runs the same logic on CPU with a tiny model (what the tests do, to exercise it end to end).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = [("ddp", False), ("fsdp", False), ("ddp", True), ("fsdp", True)]
WARMUP = 5
TARGETS = {"mfu_compiled": ">= 0.45 on an H100/H200", "checkpoint_blocking_s": "< 1"}


def run_config(parallel: str, compiled: bool, args, workdir: Path) -> dict:
    name = f"{parallel}{'-compile' if compiled else ''}"
    metrics = workdir / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "trainer", "train", "--model", args.model, "--steps", str(args.steps),
           "--batch-size", str(args.batch_size), "--precision", args.precision, "--parallel", parallel,
           "--checkpoint-format", "dcp", "--async-checkpoint",
           "--dataset", "synthetic", "--num-workers", "2" if args.device == "cuda" else "0",
           "--warmup-steps", "2", "--checkpoint-every", str(args.checkpoint_every), "--keep-checkpoints", "1",
           "--checkpoint-uri", str(workdir / name), "--metrics-file", str(metrics), "--log-every", "1000",
           "--compile" if compiled else "--no-compile"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.config_timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"timed out after {args.config_timeout}s"}
    result: dict = {"name": name, "parallel": parallel, "compile": compiled, "wall_s": time.perf_counter() - started}
    if proc.returncode != 0:
        result["error"] = f"exit {proc.returncode}: " + proc.stderr[-2000:]
        return result
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steady = records[WARMUP:] or records[-1:]
    result.update({
        "steps": len(records),
        "tokens_per_s_per_gpu": statistics.median(r["tokens_per_s_per_gpu"] for r in steady),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "mfu": statistics.median(r["mfu"] for r in steady) if all("mfu" in r for r in steady) else None,
        "peak_mem_gib": max((r.get("peak_mem_gib", 0.0) for r in records), default=0.0) or None,
        "first_step_s": records[0]["step_time_s"],
    })
    saves = [r["checkpoint_s"] for r in records if "checkpoint_s" in r][:-1]  # the last is the final, synchronous
    if saves:
        result["checkpoint_first_blocking_s"] = saves[0]
        result["checkpoint_blocking_s"] = max(saves[1:]) if len(saves) > 1 else saves[0]
    return result


def summary(results: list[dict]) -> dict:
    ok = {r["name"]: r for r in results if "error" not in r}
    out = {}
    for name, r in ok.items():
        for key in ("mfu", "tokens_per_s_per_gpu", "peak_mem_gib", "checkpoint_blocking_s"):
            if r.get(key) is not None:
                out[f"{key}_{name}"] = r[key]
    compiled = [r["mfu"] for r in ok.values() if r.get("compile") and r.get("mfu") is not None]
    if compiled:
        out["mfu_compiled"] = max(compiled)
    blocking = [r["checkpoint_blocking_s"] for r in ok.values() if "checkpoint_blocking_s" in r]
    if blocking:
        out["checkpoint_blocking_s"] = max(blocking)
    return out


def device_info(device: str) -> dict:
    import torch

    info = {"torch": torch.__version__, "python": platform.python_version(), "device": device}
    if device == "cuda" and torch.cuda.is_available():
        info.update(name=torch.cuda.get_device_name(0), cuda=torch.version.cuda, count=torch.cuda.device_count())
    return info


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", default=None, help="default: gpt-350m on cuda, gpt-tiny on cpu")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--checkpoint-every", type=int, default=None)
    parser.add_argument("--config-timeout", type=int, default=150, help="seconds per configuration")
    parser.add_argument("--budget", type=int, default=450, help="seconds for all configurations; the rest skipped")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results-gpu.json"))
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    args.model = args.model or ("gpt-350m" if gpu else "gpt-tiny")
    args.steps = args.steps or (60 if gpu else 8)
    args.batch_size = args.batch_size or (16 if gpu else 2)
    args.checkpoint_every = args.checkpoint_every or (20 if gpu else 3)
    if gpu:
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device; use --device cpu for a dry run", file=sys.stderr)
            return 2
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-gpu-") as tmp:
        for parallel, compiled in CONFIGS:
            left = args.budget - (time.monotonic() - started)
            if left < 30:
                results.append({"name": f"{parallel}{'-compile' if compiled else ''}", "error": "skipped: budget"})
                continue
            args_left = argparse.Namespace(**{**vars(args), "config_timeout": int(min(args.config_timeout, left))})
            result = run_config(parallel, compiled, args_left, Path(tmp))
            results.append(result)
            print(json.dumps(result), flush=True)
    report = {"info": {**device_info(args.device), "model": args.model, "batch_size": args.batch_size,
                       "steps": args.steps, "precision": args.precision, "wall_s": time.monotonic() - started},
              "targets": TARGETS, "summary": summary(results), "runs": results}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
