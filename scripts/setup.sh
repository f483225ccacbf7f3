#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages qshard's build needs. Idempotent: packages already present
# are not touched, and with nothing missing no package index is fetched (so it also works on a
# machine without network). Runs as root or through sudo.
set -euo pipefail

# Usage: scripts/setup.sh [--fuzz]   (--fuzz adds clang and its libFuzzer runtime, for CI's fuzz run)
packages=(
  build-essential cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin
  libspdlog-dev libfmt-dev libgtest-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libpcre2-dev libutf8proc-dev
)
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev)
fi

# A package counts as present when dpkg has it, or (for the tools) when the tool is on PATH, as on
# machines where cmake or ninja came from elsewhere.
have_tool() {
  case "$1" in
    build-essential) command -v g++ >/dev/null && command -v make >/dev/null ;;
    cmake) command -v cmake >/dev/null ;;
    ninja-build) command -v ninja >/dev/null ;;
    pkg-config) command -v pkg-config >/dev/null ;;
    openmpi-bin) command -v mpirun >/dev/null ;;
    clang) command -v clang++ >/dev/null ;;
    *) return 1 ;;
  esac
}

missing=()
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then continue; fi
  if have_tool "$p"; then continue; fi
  missing+=("$p")
done

# The CUDA backend's fused attention uses cuDNN 9 through the header-only cudnn-frontend C++ API,
# which ships in the PyPI wheel nvidia-cudnn-frontend: with nvcc on PATH its include/ folder is
# unpacked into .deps/cudnn_frontend/include (ignored by git; carried to GPU machines without
# network). Machines whose toolkit has cuDNN's own headers also copy them to .deps/cudnn/include,
# for GPU machines that have cuDNN's libraries but not its headers. Without either, the CUDA build
# goes on without fused attention (CMake says so).
kCudnnFrontendVersion=1.32.0
fetch_cudnn_frontend() {
  command -v nvcc >/dev/null 2>&1 || return 0
  local root; root="$(cd "$(dirname "$0")/.." && pwd)"
  local dst="$root/.deps/cudnn_frontend/include"
  if [ ! -f "$dst/cudnn_frontend.h" ]; then
    local tmp; tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps "nvidia-cudnn-frontend==$kCudnnFrontendVersion" -d "$tmp" >/dev/null 2>&1 &&
       python3 - "$tmp" "$root/.deps/cudnn_frontend" <<'PY'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
whl = [f for f in os.listdir(src) if f.endswith(".whl")][0]
with zipfile.ZipFile(os.path.join(src, whl)) as z:
    for n in z.namelist():
        if n.startswith("include/") and not n.endswith("/"):
            z.extract(n, dst)
PY
    then
      echo "setup: cudnn-frontend $kCudnnFrontendVersion headers in .deps/cudnn_frontend/include"
    else
      echo "setup: could not fetch nvidia-cudnn-frontend (no network?); the CUDA build goes on without fused attention" >&2
    fi
    rm -rf "$tmp"
  fi
  local cuda_inc; cuda_inc="$(dirname "$(dirname "$(command -v nvcc)")")/include"
  if [ -f "$cuda_inc/cudnn.h" ] && [ ! -f "$root/.deps/cudnn/include/cudnn.h" ]; then
    mkdir -p "$root/.deps/cudnn/include"
    cp "$cuda_inc"/cudnn*.h "$root/.deps/cudnn/include/"
  fi
}
fetch_cudnn_frontend

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "setup: missing packages (${missing[*]}) and neither root nor sudo is available" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
