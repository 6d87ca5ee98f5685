#!/usr/bin/env bash
# Two llama_cpp packages for experiments/never_slower/two_by_two.py that differ only in libggml-cpu: OUTDIR/stock
# (ggml's own x86 kernels) and OUTDIR/patched (with patches/llama-cpp-python-*-ggml-x86-two-by-two.patch). Both are
# built from the pinned llama-cpp-python source with the flags `make venv` uses (-DGGML_LLAMAFILE=OFF, native),
# about 30 s each on 2 cores, beside a copy of the installed Python package.
#
#   experiments/never_slower/two_by_two_builds.sh OUTDIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: experiments/never_slower/two_by_two_builds.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.."
py=.venv/bin/python
spec=$(grep -E '^llama-cpp-python==' requirements-llamacpp.txt)
version=${spec#*==}
installed=$("$py" -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
.venv/bin/pip download --quiet --no-deps --no-binary :all: "$spec" -d "$out"
for build in stock patched; do
  src="$out/src-$build"
  rm -rf "$src" && mkdir -p "$src" && tar xzf "$out/llama_cpp_python-$version.tar.gz" -C "$src" --strip-components 1
  if [ "$build" = patched ]; then
    patch --quiet -p1 -d "$src/vendor/llama.cpp" < "patches/llama-cpp-python-$version-ggml-x86-two-by-two.patch"
  fi
  cmake -S "$src/vendor/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_LLAMAFILE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF > "$out/cmake-$build.log"
  cmake --build "$src/build" --target ggml-cpu -j 2 > "$out/build-$build.log" 2>&1
  rm -rf "${out:?}/$build" && mkdir -p "$out/$build" && cp -r "$installed" "$out/$build/"
  for f in "$out/$build/llama_cpp/lib/"libggml-cpu.so*; do cp "$src/build/bin/libggml-cpu.so.0."*.* "$f"; done
  echo "$out/$build: llama_cpp with $build libggml-cpu"
done
