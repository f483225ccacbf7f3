#!/usr/bin/env bash
# For a GPU machine that has PCRE2's runtime library (libpcre2-8.so.0, part of every Ubuntu) but not
# its -dev package and cannot install it: copies this machine's pcre2.h into .deps/pcre2 with a
# pkg-config file naming the system library by its path. Carry .deps there and build with
# PKG_CONFIG_PATH=$PWD/.deps/pcre2/lib/pkgconfig after linking .deps/pcre2/lib/libpcre2-8.so to the
# system's libpcre2-8.so.0 there (scripts/gpu/gpu_train_check.sh does both): the library then comes
# in as a library (-l), placed after the static libraries that need it on the link line (a full
# path in Libs became a link option, placed before them, and qshard did not link).
set -euo pipefail
cd "$(dirname "$0")/../.."
h=$(echo '#include <pcre2.h>' | cpp -H -DPCRE2_CODE_UNIT_WIDTH=8 -o /dev/null 2>&1 | awk '/pcre2.h/ && !h {h = $2} END {print h}')  # reads all of cpp's output: no SIGPIPE under pipefail
[ -f "$h" ] || { echo "carry_pcre2.sh: no pcre2.h here (apt-get install libpcre2-dev)" >&2; exit 1; }
mkdir -p .deps/pcre2/include .deps/pcre2/lib/pkgconfig
cp "$h" .deps/pcre2/include/
cat > .deps/pcre2/lib/pkgconfig/libpcre2-8.pc <<'PC'
prefix=${pcfiledir}/../..
includedir=${prefix}/include
Name: libpcre2-8
Description: PCRE2 8-bit (header carried; the system's libpcre2-8.so.0)
Version: 10.42
Libs: -L${prefix}/lib -lpcre2-8
Cflags: -I${includedir}
PC
echo "carry_pcre2.sh: .deps/pcre2 ready"
