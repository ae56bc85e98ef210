#!/usr/bin/env bash
# Build llama.cpp's `llama-server` and `llama-quantize` from the llama.cpp source that the registry's
# llama-cpp-python sdist vendors, and keep its GGUF converter beside them. `make llamacpp` runs it as
#
#     bash scripts/build_llamacpp.sh --dest .venvs/llamacpp --pip .venv/bin/pip
#
# Stages (one progress line each, with its seconds):
#   1 download   pip download --no-deps --no-binary :all: llama-cpp-python==VERSION (the sdist, sha256 checked)
#   2 extract    the sdist into DEST/src
#   3 configure  cmake of its vendor/llama.cpp: Release, native CPU, no web UI, no OpenSSL, no tests
#   4 build      the two targets only (the whole project has ~400 objects; these two need about half)
#   5 install    the binaries into DEST/bin; convert_hf_to_gguf.py, its conversion/ package and gguf-py into
#                DEST/convert; sentencepiece (which the converter imports) into DEST/convert/site
# then DEST/BUILD-INFO.json (version, sdist sha256, compiler, flags, seconds per stage) and DEST/.installed.
#
# Why -mno-amx-int8: with GGML_NATIVE on an Intel CPU that has AMX, ggml adds an AMX matrix path that faults
# (SIGSEGV at `ldtilecfg`) at the first generated token on the VMs this runs on; leaving AMX out of the build
# avoids it and costs nothing elsewhere (the flag is a no-op on CPUs without AMX, e.g. AMD EPYC).
# The converter runs with servegate's own interpreter (torch, transformers, numpy, safetensors are there):
#     PYTHONPATH=DEST/convert/gguf-py:DEST/convert/site .venv/bin/python DEST/convert/convert_hf_to_gguf.py ...
set -euo pipefail

VERSION=0.3.36
# sha256 of llama_cpp_python-0.3.36.tar.gz as the registry served it (checked after the download)
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
DEST=.venvs/llamacpp
PIP=
JOBS=$(nproc 2>/dev/null || echo 2)
TARGETS=(llama-server llama-quantize)

usage() {
    echo "usage: $0 [--dest DIR] [--pip PIP] [--jobs N] [--until download|extract|configure|build]" >&2
    exit 2
}

UNTIL=
while [ $# -gt 0 ]; do
    case "$1" in
        --dest) DEST=$2; shift 2 ;;
        --pip) PIP=$2; shift 2 ;;
        --jobs) JOBS=$2; shift 2 ;;
        --until) UNTIL=$2; shift 2 ;;
        *) usage ;;
    esac
done
case "$UNTIL" in ""|download|extract|configure|build) ;; *) usage ;; esac
if [ -z "$PIP" ]; then
    PIP="python3 -m pip"
fi
for tool in cmake ninja cc c++; do
    command -v "$tool" >/dev/null || { echo "build_llamacpp: $tool is not installed (needs cmake, ninja, a C/C++ compiler)" >&2; exit 2; }
done

mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
SRC=$DEST/src
TREE=$SRC/llama_cpp_python-$VERSION
LLAMA=$TREE/vendor/llama.cpp
BUILD=$SRC/build
STARTED=$(date +%s)
declare -A SECONDS_OF

stage() {  # stage NUMBER NAME: print the progress line and remember when it began
    STAGE_NAME=$2
    STAGE_START=$(date +%s)
    echo "[llamacpp $1/5] $2 ..." >&2
}

done_stage() {
    local took=$(( $(date +%s) - STAGE_START ))
    SECONDS_OF[$STAGE_NAME]=$took
    echo "[llamacpp] $STAGE_NAME done in ${took} s" >&2
    if [ "$UNTIL" = "$STAGE_NAME" ]; then
        echo "[llamacpp] stopped after $STAGE_NAME (--until)" >&2
        exit 0
    fi
}

stage 1 download
mkdir -p "$SRC/sdist"
SDIST=$SRC/sdist/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    # --no-binary: the source, never a prebuilt wheel; --no-deps: only this package, its server extra is unused
    $PIP download --quiet --no-deps --no-binary :all: -d "$SRC/sdist" "llama-cpp-python==$VERSION"
fi
ACTUAL=$(sha256sum "$SDIST" | cut -d' ' -f1)
if [ "$ACTUAL" != "$SDIST_SHA256" ]; then
    echo "build_llamacpp: $SDIST has sha256 $ACTUAL, expected $SDIST_SHA256: delete it and retry" >&2
    exit 1
fi
done_stage

stage 2 extract
if [ ! -f "$LLAMA/CMakeLists.txt" ]; then
    rm -rf "$TREE"
    tar -xzf "$SDIST" -C "$SRC"
fi
done_stage

stage 3 configure
FLAGS=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    "-DCMAKE_C_FLAGS=-mno-amx-int8"
    "-DCMAKE_CXX_FLAGS=-mno-amx-int8"
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
)
cmake -S "$LLAMA" -B "$BUILD" "${FLAGS[@]}" >"$SRC/configure.log" 2>&1 \
    || { echo "build_llamacpp: cmake configure failed, see $SRC/configure.log" >&2; exit 1; }
done_stage

stage 4 build
echo "[llamacpp] compiling ${TARGETS[*]} with $JOBS jobs (about 9 min on 2 cores); log $SRC/build.log" >&2
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$SRC/build.log" 2>&1 \
    || { tail -20 "$SRC/build.log" >&2; echo "build_llamacpp: build failed, see $SRC/build.log" >&2; exit 1; }
done_stage

stage 5 install
mkdir -p "$DEST/bin" "$DEST/convert"
for target in "${TARGETS[@]}"; do  # renamed into place: a server running the old binary keeps running
    install -m 0755 "$BUILD/bin/$target" "$DEST/bin/.$target.new"
    mv -f "$DEST/bin/.$target.new" "$DEST/bin/$target"
done
rm -rf "$DEST/convert/conversion" "$DEST/convert/gguf-py"
cp "$LLAMA/convert_hf_to_gguf.py" "$DEST/convert/"
cp -r "$LLAMA/conversion" "$LLAMA/gguf-py" "$DEST/convert/"
cp "$LLAMA/LICENSE" "$DEST/convert/LICENSE-llama.cpp"
if [ ! -d "$DEST/convert/site/sentencepiece" ]; then
    # the converter imports sentencepiece before it looks for a tokenizer.model, even for a BPE tokenizer
    $PIP install --quiet --target "$DEST/convert/site" 'sentencepiece>=0.1.98,<0.3.0'
fi
"$DEST/bin/llama-server" --version >"$DEST/version.txt" 2>&1 || true
done_stage

TOTAL=$(( $(date +%s) - STARTED ))
COMPILER=$(cc --version | head -1)
# JSON by hand: no Python is assumed here beyond the one pip may be
{
    echo "{"
    echo "  \"package\": \"llama-cpp-python\","
    echo "  \"version\": \"$VERSION\","
    echo "  \"sdist_sha256\": \"$SDIST_SHA256\","
    echo "  \"llama_server_version\": \"$(tr '\n' ' ' <"$DEST/version.txt" | sed 's/"/\\"/g; s/ *$//')\","
    echo "  \"compiler\": \"$COMPILER\","
    echo "  \"cmake_flags\": \"${FLAGS[*]}\","
    echo "  \"targets\": \"${TARGETS[*]}\","
    echo "  \"jobs\": $JOBS,"
    echo "  \"seconds\": {\"download\": ${SECONDS_OF[download]}, \"extract\": ${SECONDS_OF[extract]}, \"configure\": ${SECONDS_OF[configure]}, \"build\": ${SECONDS_OF[build]}, \"install\": ${SECONDS_OF[install]}, \"total\": $TOTAL}"
    echo "}"
} >"$DEST/BUILD-INFO.json"
touch "$DEST/.installed"
echo "[llamacpp] ready in ${TOTAL} s: $DEST/bin/llama-server, $DEST/bin/llama-quantize, $DEST/convert/convert_hf_to_gguf.py" >&2
