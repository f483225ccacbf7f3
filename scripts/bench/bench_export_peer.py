#!/usr/bin/env python3
"""Peer measurement for bench/export: transformers + bitsandbytes saving the same 4-bit model.

Loads the bitsandbytes 4-bit folder that `bench_export --formats bnb4 --keep-only bnb4` wrote with
    AutoModelForCausalLM.from_pretrained(DIR, device_map=DEVICE, dtype=torch.bfloat16)
and times `model.save_pretrained(OUT)` (safetensors, transformers' default max_shard_size), the
way a QLoRA user writes a bnb4 checkpoint, next to qshard's export_model() of the same model.

Per phase (load, save) it reports the wall time and this process' host memory, measured as
bench/export does: the peak is VmHWM of /proc/self/status after writing "5" to
/proc/self/clear_refs (the kernel's exact high-water mark since the reset); where clear_refs is not
writable the peak is the largest VmRSS seen by a thread polling every 2 ms (it needs the GIL, so it
can miss peaks inside long C calls) and the JSON says so. getrusage's ru_maxrss (the process'
lifetime peak) is reported beside it. Save: bytes written, files, GB/s. The saved folder's tensor
names, dtypes and shapes are compared with qshard's (headers only).

Usage:
    python3 scripts/bench/bench_export_peer.py BNB4_DIR [--out SAVE_DIR] [--json FILE] [--device cuda|cpu] [--keep]
--device cpu is for a machine without a GPU (bitsandbytes' CPU backend), to check the script runs.
Exits 0 with {"skipped": "..."} in the JSON when torch, bitsandbytes or (for --device cuda) a CUDA
device is unavailable.
"""
import argparse
import datetime
import inspect
import json
import os
import resource
import shutil
import socket
import struct
import sys
import threading
import time


def proc_status():
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of /proc/self/status in bytes (-1 when absent)."""
    keys = {"VmRSS": "rss", "VmHWM": "hwm", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}
    out = {v: -1 for v in keys.values()}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in keys:
                    out[keys[k]] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_peak():
    """Resets VmHWM to the current VmRSS; False when /proc/self/clear_refs is not writable."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rusage_max_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class Sampler(threading.Thread):
    """Polls /proc/self/status every `period` seconds, keeping each field's maximum."""

    def __init__(self, period=0.002):
        super().__init__(daemon=True)
        self.period, self.done, self.max = period, threading.Event(), proc_status()

    def sample(self):
        for k, v in proc_status().items():
            self.max[k] = max(self.max[k], v)

    def run(self):
        while not self.done.wait(self.period):
            self.sample()

    def stop(self):
        self.done.set()
        self.join()
        self.sample()
        return self.max


def measured(fn, sync):
    """Runs fn() and returns (its result, a dict of time and host memory)."""
    import gc
    gc.collect()
    hwm_reset = reset_peak()
    before, ru_before = proc_status(), rusage_max_rss()
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    result = fn()
    sync()
    seconds = time.perf_counter() - t0
    sampled, after = sampler.stop(), proc_status()
    peak = after["hwm"] if hwm_reset and after["hwm"] >= 0 else sampled["rss"]
    return result, {
        "seconds": seconds, "hwm_reset": hwm_reset,
        "peak_method": "VmHWM after clear_refs" if hwm_reset else "sampled VmRSS (clear_refs not writable)",
        "baseline": before, "after": after, "sampled_max": sampled, "peak_rss": peak,
        "peak_minus_baseline": peak - before["rss"],
        "anon_peak_minus_baseline": sampled["anon"] - before["anon"],
        "file_peak_minus_baseline": sampled["file"] - before["file"],
        "rusage_max_rss_before": ru_before, "rusage_max_rss_after": rusage_max_rss(),
    }


def safetensors_headers(folder):
    """{name: (dtype, shape)} of every .safetensors file in a folder, from the headers alone."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = (v["dtype"], tuple(v["shape"]))
    return out


def folder_bytes(folder):
    files = sorted(os.listdir(folder))
    return files, sum(os.path.getsize(os.path.join(folder, f)) for f in files)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def write_json(path, record):
    text = json.dumps(record, indent=2, sort_keys=True)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="bitsandbytes 4-bit folder written by bench_export (config.json + safetensors)")
    ap.add_argument("--out", default=None, help="where save_pretrained writes (default DIR.peer_save; must not exist)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="device_map of from_pretrained")
    ap.add_argument("--keep", action="store_true", help="keep the saved folder")
    args = ap.parse_args()
    out = args.out or args.dir.rstrip("/") + ".peer_save"
    record = {"bench": "export_peer", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "hostname": socket.gethostname(), "cpu_model": cpu_model(), "cpu_threads": os.cpu_count(),
              "command": " ".join([sys.executable] + sys.argv), "dir": args.dir, "device": args.device}

    def skip(reason):
        record["skipped"] = reason
        print(write_json(args.json, record))
        return 0

    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer here
        return skip(f"torch not importable: {e}")
    try:
        import bitsandbytes
    except Exception as e:  # noqa: BLE001
        return skip(f"bitsandbytes not importable: {e}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return skip("torch.cuda not available (use --device cpu to run on the CPU)")
    import safetensors
    import transformers
    from transformers import AutoModelForCausalLM

    if os.path.exists(out):
        sys.exit(f"--out {out}: exists; choose a new folder")
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    record["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                          "transformers": transformers.__version__, "bitsandbytes": bitsandbytes.__version__,
                          "safetensors": safetensors.__version__}
    if cuda:
        record["gpu"] = torch.cuda.get_device_name(0)

    # transformers >= 4.56 names the argument `dtype`; older releases only know `torch_dtype`.
    load_params = inspect.signature(AutoModelForCausalLM.from_pretrained).parameters
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    dtype_kw = "dtype" if version >= (4, 56) or "dtype" in load_params else "torch_dtype"
    record["load_call"] = f"from_pretrained(dir, device_map={args.device!r}, {dtype_kw}=torch.bfloat16)"
    model, record["load"] = measured(
        lambda: AutoModelForCausalLM.from_pretrained(args.dir, device_map=args.device, **{dtype_kw: torch.bfloat16}),
        sync)

    save_params = inspect.signature(model.save_pretrained).parameters
    save_kw = {"safe_serialization": True} if "safe_serialization" in save_params else {}
    record["max_shard_size"] = str(save_params["max_shard_size"].default) if "max_shard_size" in save_params else None
    record["save_call"] = f"save_pretrained(out{', safe_serialization=True' if save_kw else ''})"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        try:
            _, save = measured(lambda: model.save_pretrained(out, **save_kw), sync)
        except NotImplementedError:
            # transformers 5.x: a pre-quantized bnb4 model's load conversion (Bnb4bitDeserialize)
            # has no reverse_op, so the default save fails before writing (huggingface/transformers
            # PR 45743). save_original_format=False skips that revert; for a Llama the state dict is
            # already in bitsandbytes' key layout (checked below against qshard's folder).
            if "save_original_format" not in save_params:
                raise
            shutil.rmtree(out, ignore_errors=True)
            save_kw["save_original_format"] = False
            record["save_workaround"] = ("default save_pretrained raised NotImplementedError (no reverse_op for "
                                         "Bnb4bitDeserialize); saved with save_original_format=False")
            record["save_call"] = f"save_pretrained(out, {', '.join(f'{k}={v}' for k, v in save_kw.items())})"
            _, save = measured(lambda: model.save_pretrained(out, **save_kw), sync)
        files, nbytes = folder_bytes(out)
        save.update({"files": files, "bytes": nbytes, "gb_per_s": nbytes / 1e9 / save["seconds"]})
        if cuda:
            save["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        record["save"] = save
        # Same tensors as qshard's folder? (names, dtypes and shapes from the headers)
        mine, theirs = safetensors_headers(args.dir), safetensors_headers(out)
        diff = sorted(set(mine.items()) ^ set(theirs.items()))
        record["compare_with_qshard"] = {"qshard_tensors": len(mine), "peer_tensors": len(theirs),
                                         "same_names_dtypes_shapes": not diff,
                                         "differences": [f"{k}: {v}" for k, v in diff[:10]]}
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)

    gb = 1e9
    for phase in ("load", "save"):
        r = record[phase]
        print(f"peer {phase}: {r['seconds']:.2f} s, RSS base {r['baseline']['rss'] / gb:.3f} GB, "
              f"peak {r['peak_rss'] / gb:.3f} GB (+{r['peak_minus_baseline'] / gb:.3f}; anon "
              f"+{r['anon_peak_minus_baseline'] / gb:.3f}, file +{r['file_peak_minus_baseline'] / gb:.3f}) "
              f"[{r['peak_method']}]")
    s = record["save"]
    c = record["compare_with_qshard"]
    print(f"peer save: {s['bytes'] / gb:.3f} GB in {len(s['files'])} files, {s['gb_per_s']:.3f} GB/s "
          f"(max_shard_size {record['max_shard_size']}); same tensors as qshard: {c['same_names_dtypes_shapes']}")
    write_json(args.json, record)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
