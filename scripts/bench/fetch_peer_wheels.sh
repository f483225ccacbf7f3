#!/usr/bin/env bash
# Fetch the Python packages that the Unsloth peer (scripts/bench/bench_peer.py --peer unsloth) needs
# on the GPU machine and that its image lacks, as one extracted site-packages tree:
#   .whl/peer/site/   (put on PYTHONPATH there; scripts/gpu/gpu_bench.sh's `unsloth` stage copies it
#                      to /tmp/site-peer first, since Unsloth writes beside its own modules)
#   .whl/peer/MANIFEST.txt  (package, version, wheel size, size on disk after stripping)
# Run on a development machine with PyPI access (pip download), not on the GPU machine. The GPU
# image (Python 3.12, torch 2.11 cu130, transformers 5.17.0, peft 0.21, accelerate, pyarrow, xxhash,
# pandas, fsspec, triton, sentencepiece, tokenizers ...) supplies everything else.
#
# The tree stays small (the carried payload's limit): no wheel is kept, only the extracted files;
# Unsloth's web UI (studio/, 82 MB) and CLI, bitsandbytes' libraries for other CUDA/ROCm versions,
# torchao's CUTLASS kernels (QAT/fp8 paths only) and every __pycache__ are dropped. hf_transfer
# (a Rust downloader: no use offline, unsloth_zoo only checks find_spec) and diffusers (not imported
# by unsloth 2026.10.9 at all) are not fetched; FETCH_ALL=1 fetches them too.
#
# Pins: unsloth 2026.10.9 needs trl<=1.15.0 and datasets<5 (not 4.4.*, 4.5.0), and trl 1.15.0
# needs datasets>=4.7.0, so datasets is 4.8.5 (4.3.0 does not satisfy trl); datasets 4.8.5 needs
# dill<0.4.2 and multiprocess<0.70.20.
# Usage: scripts/bench/fetch_peer_wheels.sh [DEST]   (DEST default .whl/peer; downloads cached in
#        ${PEER_WHEEL_CACHE:-/tmp/qshard-peer-wheels})
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl/peer}
CACHE=${PEER_WHEEL_CACHE:-/tmp/qshard-peer-wheels}
PY=${PYTHON:-python3}
mkdir -p "$CACHE"

PKGS=(
  unsloth==2026.10.9
  unsloth_zoo==2026.10.9
  trl==1.15.0
  datasets==4.8.5
  dill==0.4.1
  multiprocess==0.70.19
  bitsandbytes==0.50.2
  torchao==0.18.0
  cut_cross_entropy==25.1.1
  tyro==1.0.17
  docstring_parser==0.18.0
  typeguard==4.6.1
  shtab==1.13.0
  msgspec==0.23.0
  json5==0.17.3
  nest_asyncio==1.6.0
  structlog==26.1.0
)
[ "${FETCH_ALL:-0}" = 1 ] && PKGS+=(hf_transfer==0.1.9 diffusers==0.42.1 importlib_metadata)

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$CACHE" "${PKGS[@]}"

rm -rf "$DEST"
mkdir -p "$DEST/site"
: > "$DEST/MANIFEST.txt"
for spec in "${PKGS[@]}"; do
  name=${spec%%==*}
  ver=${spec#*==}
  [ "$ver" = "$spec" ] && ver=""
  # wheel file names use underscores for dashes; match name-version exactly
  whl=$(ls "$CACHE"/*.whl | grep -i -E "/${name//[-_]/[-_]}-${ver:-[0-9]}[^-]*-" | sort -V | tail -1)
  [ -n "$whl" ] || { echo "no wheel for $spec in $CACHE" >&2; exit 1; }
  unzip -q -o "$whl" -d "$DEST/site"
  echo "$(basename "$whl") $(du -k "$whl" | cut -f1)KB" >> "$DEST/MANIFEST.txt"
done

S=$DEST/site
# Unsloth: the web UI (studio) and the CLI are not imported by `import unsloth`.
rm -rf "$S/studio" "$S/unsloth_cli"
# bitsandbytes: keep the CUDA 13.0 library (the GPU image's torch is cu130) and the CPU one.
find "$S/bitsandbytes" -maxdepth 1 -name 'libbitsandbytes_*.so' ! -name 'libbitsandbytes_cuda130.so' \
  ! -name 'libbitsandbytes_cpu.so' -delete
# torchao: its CUTLASS / mxfp8 kernels serve QAT and fp8 paths the QLoRA benchmark never takes;
# torchao loads its .so files in a try and only warns when they are missing.
rm -f "$S"/torchao/_C*.so
# torchao's wheel ships its tests as a top-level `test` package (it would shadow the stdlib's);
# dill's scripts; the test suites of dill and multiprocess.
rm -rf "$S/test" "$S"/*.data "$S/dill/tests" "$S/multiprocess/tests"
find "$S" -name __pycache__ -type d -prune -exec rm -rf {} +
# Drop *.dist-info/RECORD so nothing tries to verify hashes of the stripped files; METADATA stays
# (unsloth reads versions through importlib.metadata).
find "$S" -path '*.dist-info/RECORD' -delete

{
  echo "--- sizes on disk (KB) after stripping"
  du -sk "$S"/* | sort -rn
  echo "--- total"
  du -sk "$DEST"
} >> "$DEST/MANIFEST.txt"
ls "$S/bitsandbytes"/*.so
echo "$DEST: $(du -sh "$DEST" | cut -f1) ($(find "$DEST" -type f | wc -l) files); manifest in $DEST/MANIFEST.txt"
