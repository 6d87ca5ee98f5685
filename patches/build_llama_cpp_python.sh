#!/usr/bin/env bash
# Builds and installs llama-cpp-python, the version requirements-llamacpp.txt pins, from its source package with
# hyflash's patch to ggml's x86 kernels applied (`make venv` runs this; docs/engine.md, "ggml's two-by-two
# kernels"). The patch makes multi-token passes cheaper and leaves every number a pass computes as it was.
#
#   patches/build_llama_cpp_python.sh PIP "CMAKE_ARGS" [patch|stock]
#
# stock: the same build without the patch (`make venv LLAMA_PATCH=stock`, or to compare the two).
set -euo pipefail
die() { echo "build_llama_cpp_python: error: $*" >&2; exit 1; }
[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: patches/build_llama_cpp_python.sh PIP \"CMAKE_ARGS\" [patch|stock]"
pip=$1 cmake_args=$2 mode=${3:-patch}
case "$mode" in patch|stock) ;; *) die "the third argument must be patch or stock, got '$mode'";; esac
cd "$(dirname "$0")/.."
spec=$(grep -E '^llama-cpp-python==' requirements-llamacpp.txt) || die "requirements-llamacpp.txt pins no llama-cpp-python"
version=${spec#*==}
patch_file="patches/llama-cpp-python-$version-ggml-x86-two-by-two.patch"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$pip" download --quiet --no-deps --no-binary :all: "$spec" -d "$work" || die "could not download $spec's source"
tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
src="$work/llama_cpp_python-$version"
if [ "$mode" = patch ]; then
  [ -f "$patch_file" ] || die "no patch for llama-cpp-python $version ($patch_file): port it, or build stock"
  patch --batch --quiet --forward -p1 -d "$src/vendor/llama.cpp" < "$patch_file" \
    || die "$patch_file does not apply to llama-cpp-python $version: port it, or build stock"
  echo "llama-cpp-python $version: ggml's x86 two-by-two kernels patched in ($patch_file)"
fi
CMAKE_ARGS="$cmake_args" "$pip" install --quiet --no-cache-dir --force-reinstall --no-deps "$src"
"$pip" install --quiet -r requirements-llamacpp.txt  # its own dependencies (the package itself is in place)
