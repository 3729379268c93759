#!/usr/bin/env bash
# Debian/Ubuntu packages that pip cannot bring, installed only when missing.
#   scripts/system-deps.sh app   -> libgfortran5 (needed by cmeel-openblas, the fast BLAS for MLX);
#                                   optional: without it MLX falls back, with a visible warning.
#                                   cmake, g++ and ninja build rlxviz's CPU kernels on first use
#                                   (rlxviz/kernels); optional: without them fused ops run MLX's lowering.
#   scripts/system-deps.sh test  -> also chromium (browser tests) and graphviz (the system `dot`
#                                   engine is tested next to the pip one); required (the kernels too: CI
#                                   tests the built path).
# Uses apt-get (as root, or through sudo). Elsewhere it prints what is missing.
set -euo pipefail
mode="${1:-test}"
need=()
if [ "$(uname -s)" = "Linux" ]; then
  ldconfig -p 2>/dev/null | grep -q 'libgfortran.so.5' || need+=(libgfortran5)
  # Debian's OpenBLAS (built for every x86 CPU) is the fallback where cmeel's fails its probe.
  ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0' || need+=(libopenblas0-pthread)
fi
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
if [ "$mode" = "test" ]; then
  [ -x /usr/bin/chromium ] || need+=(chromium)
  command -v dot >/dev/null 2>&1 || need+=(graphviz)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "system-deps: missing Debian packages: ${need[*]}; run as root: apt-get install ${need[*]}" >&2
      [ "$mode" = "app" ] && exit 0 || exit 1
    fi
  fi
  echo "system-deps: installing Debian packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "system-deps: missing: ${need[*]} (install them with your system's package manager)" >&2
  [ "$mode" = "app" ] && exit 0 || exit 1
fi
