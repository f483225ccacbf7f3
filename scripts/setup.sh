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
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
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
