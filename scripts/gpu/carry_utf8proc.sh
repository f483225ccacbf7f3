#!/usr/bin/env bash
# For a GPU machine without libutf8proc-dev that cannot install it (the tokenizer's NFC / NFD / NFKC /
# NFKD normalizers, Qwen's tokenizer.json, need utf8proc): copies this machine's utf8proc.h and its
# static library (Debian's libutf8proc.a, position-independent) into .deps/utf8proc/{include,lib}.
# Carry .deps there: CMake (src/text/CMakeLists.txt) looks in .deps/utf8proc when pkg-config has no
# libutf8proc, and links the static library, so the GPU machine needs no utf8proc of its own. Without
# either, the build goes on and the tokenizer refuses those normalizers at load.
set -euo pipefail
cd "$(dirname "$0")/../.."
h=/usr/include/utf8proc.h
a=$(find /usr/lib /usr/lib64 -name libutf8proc.a 2>/dev/null | head -1)
[ -f "$h" ] && [ -n "$a" ] || { echo "carry_utf8proc.sh: no utf8proc.h / libutf8proc.a here (apt-get install libutf8proc-dev)" >&2; exit 1; }
mkdir -p .deps/utf8proc/include .deps/utf8proc/lib
cp "$h" .deps/utf8proc/include/
cp "$a" .deps/utf8proc/lib/
echo "carry_utf8proc.sh: .deps/utf8proc ready ($(grep -m1 -o 'UTF8PROC_VERSION_MINOR [0-9]*' "$h"))"
