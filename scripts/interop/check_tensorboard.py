#!/usr/bin/env python3
"""logging.tensorboard_dir checked against the real TensorBoard (pip install tensorboard).

Usage: check_tensorboard.py [--qshard build/cpu/qshard] [--mpirun mpirun] [--work DIR] [--no-serve]
       check_tensorboard.py --logdir DIR --jsonl FILE [--no-serve]     (an existing run's folder)

Without --logdir: `qshard tokenize` the shipped text, `qshard train` configs/tiny.yaml on 2 ranks
(CPU) for 4 steps with a checkpoint every 2, then a resume from step 2 into the same JSONL and
event folder (the resume writes a second event file; its steps 3-4 supersede the first file's).
Then, on the folder:
1. every record of every event file through tensorboard's own TFRecord reader
   (tensorflow_stub's PyRecordReader, which raises on a length or data CRC-32C mismatch) and its
   event_pb2 parser: the first record of each file is file_version "brain.Event:2";
2. tensorboard.backend.event_processing.event_accumulator.EventAccumulator (no sampling) loads
   the folder: its scalar tags are exactly the JSONL's keys but "step", and for every line and key
   the accumulator holds one point at that step whose value is the JSON number as a float32
   (null: NaN) - nothing missing, nothing extra, no step twice;
3. (unless --no-serve) `tensorboard --logdir DIR --load_fast=true` (the Rust data server, what a
   user's browser gets) serves /data/plugin/scalars/scalars for each tag with the same points.
Prints one line per check and "tensorboard interop: ok"; exits 1 on the first mismatch.
Not run in CI (needs the tensorboard package); the C++ tests read the same files with their own
decoder (tests/train/tensorboard_test.cpp, tensorboard_train_test.cpp).
"""
import argparse
import glob
import json
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr[-4000:])
        fail("%s exited %d" % (cmd[0], r.returncode))
    return r.stdout


def train_twice(args):
    w = args.work
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    tok = os.path.join(w, "tiny.tok")
    run([args.qshard, "tokenize"] + sorted(glob.glob(os.path.join(ROOT, "data", "*.txt"))) + ["--out", tok])
    jsonl, tb = os.path.join(w, "metrics.jsonl"), os.path.join(w, "tb")
    sets = ["device=cpu", "data.train=" + tok, "steps=4", "batch.global_batch_size=4", "schedule.warmup_steps=1",
            "logging.every_steps=1", "logging.eval_every_steps=2", "logging.metrics_jsonl=" + jsonl,
            "logging.tensorboard_dir=" + tb, "checkpoint.every_steps=2", "checkpoint.keep_last=0"]
    mpi = [args.mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        mpi.append("--allow-run-as-root")
    base = mpi + [args.qshard, "train", "--config", os.path.join(ROOT, "configs", "tiny.yaml")]
    flags = lambda extra: sum((["--set", s] for s in sets + extra), [])
    run(base + flags(["checkpoint.dir=" + os.path.join(w, "ck1")]))
    run(base + flags(["checkpoint.dir=" + os.path.join(w, "ck2"),
                      "checkpoint.resume=" + os.path.join(w, "ck1", "step-00000002")]))
    return tb, jsonl


def jsonl_points(path):
    want = {}  # tag -> {step: float32 value}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            for k, v in j.items():
                if k == "step":
                    continue
                want.setdefault(k, {})[j["step"]] = float("nan") if v is None else f32(float(v))
    return want


def check_records(tb):
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
    files = sorted(glob.glob(os.path.join(tb, "*tfevents*")))
    if not files:
        fail("no *tfevents* file in " + tb)
    for path in files:
        reader = PyRecordReader_New(path)
        events = []
        while True:
            try:
                reader.GetNext()  # raises DataLossError on a CRC mismatch
            except errors.OutOfRangeError:
                break
            events.append(event_pb2.Event.FromString(reader.record()))
        if not events or events[0].file_version != "brain.Event:2":
            fail("%s: first record is not file_version brain.Event:2" % path)
        print("%s: %d records, CRCs ok, file_version %s" % (os.path.basename(path), len(events), events[0].file_version))
    return files


def check_accumulator(tb, want):
    from tensorboard.backend.event_processing import event_accumulator as ea_mod
    ea = ea_mod.EventAccumulator(tb, size_guidance={ea_mod.SCALARS: 0})
    ea.Reload()
    tags = sorted(ea.Tags()["scalars"])
    if tags != sorted(want):
        fail("EventAccumulator tags %s != JSONL keys %s" % (tags, sorted(want)))
    n = 0
    for tag in tags:
        got = ea.Scalars(tag)
        steps = [e.step for e in got]
        if len(steps) != len(set(steps)):
            fail("%s: a step appears twice: %s" % (tag, steps))
        gm = {e.step: e.value for e in got}
        if sorted(gm) != sorted(want[tag]):
            fail("%s: steps %s != JSONL steps %s" % (tag, sorted(gm), sorted(want[tag])))
        for s, v in want[tag].items():
            if not same(gm[s], v):
                fail("%s step %d: TensorBoard %r != JSONL %r" % (tag, s, gm[s], v))
            n += 1
    print("EventAccumulator: %d tags, %d points equal the JSONL (loss %s)" %
          (len(tags), n, " ".join("%d:%.4f" % (s, v) for s, v in sorted(want["loss"].items()))))


def check_server(tb, want):
    tensorboard = shutil.which("tensorboard") or os.path.join(os.path.dirname(sys.executable), "tensorboard")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([tensorboard, "--logdir", tb, "--port", str(port), "--host", "127.0.0.1",
                             "--load_fast=true", "--reload_interval=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = "http://127.0.0.1:%d/data/plugin/scalars/scalars?" % port
        n, deadline = 0, time.time() + 60
        for tag, points in sorted(want.items()):
            while True:
                try:
                    url = base + urllib.parse.urlencode({"run": ".", "tag": tag})
                    got = json.load(urllib.request.urlopen(url, timeout=5))  # [[wall_time, step, value], ...]
                    if len(got) >= len(points):
                        break
                except Exception:
                    pass
                if time.time() > deadline:
                    fail("tensorboard server: no data for tag %s within 60 s" % tag)
                time.sleep(1)
            gm = {int(s): float("nan") if v is None or v == "NaN" else float(v) for _, s, v in got}
            if len(gm) != len(got) or sorted(gm) != sorted(points):
                fail("server %s: steps %s != JSONL steps %s" % (tag, [g[1] for g in got], sorted(points)))
            for s, v in points.items():
                if not same(gm[s], v):
                    fail("server %s step %d: %r != JSONL %r" % (tag, s, gm[s], v))
                n += 1
        print("tensorboard server (--load_fast=true): %d tags, %d points equal the JSONL" % (len(want), n))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qshard", default=os.path.join(ROOT, "build", "cpu", "qshard"))
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--work", default="/tmp/qshard_tensorboard_interop")
    ap.add_argument("--logdir", help="an existing logging.tensorboard_dir (with --jsonl)")
    ap.add_argument("--jsonl", help="the same run's logging.metrics_jsonl")
    ap.add_argument("--no-serve", action="store_true", help="skip the tensorboard server check")
    args = ap.parse_args()
    import tensorboard
    print("tensorboard " + tensorboard.__version__)
    if args.logdir:
        if not args.jsonl:
            ap.error("--logdir needs --jsonl")
        tb, jsonl = args.logdir, args.jsonl
    else:
        tb, jsonl = train_twice(args)
    want = jsonl_points(jsonl)
    files = check_records(tb)
    if not args.logdir and len(files) != 2:
        fail("expected 2 event files (the run and its resume), found %d" % len(files))
    check_accumulator(tb, want)
    if not args.no_serve:
        check_server(tb, want)
    print("tensorboard interop: ok")


if __name__ == "__main__":
    main()
