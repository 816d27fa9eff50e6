#!/usr/bin/env bash
# Code coverage of the vPMU crates under the conformance suite, read through the guest-visible
# XENPMU_OP_COVERAGE (docs/coverage.md):
#   1. installs clang (minicov's build compiles LLVM's profile runtime with it) and, if the
#      package exists, Debian's llvm-22 tools (llvm-profdata-22, llvm-cov-22) for the report;
#   2. builds the VMM with the `coverage` feature and only the vPMU crates and minicov
#      instrumented (scripts/rustc-coverage-wrapper), in its own target directory;
#   3. runs `vpmu coverage`, which runs the conformance suite, reads the profile through the
#      guest, validates it, and writes the report.
# Usage: scripts/coverage.sh [OUT_DIR]   (default coverage-out). Exit status: vpmu coverage's.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-coverage-out}"

if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if ! command -v clang >/dev/null; then
    echo "coverage: installing clang (minicov builds LLVM's profile runtime with it)" >&2
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq clang >/dev/null
fi
if ! command -v llvm-cov-22 >/dev/null && ! command -v llvm-cov-19 >/dev/null; then
    echo "coverage: installing llvm-22 for llvm-profdata-22 and llvm-cov-22 (the report)" >&2
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq llvm-22 >/dev/null; } ||
        echo "coverage: llvm-22 could not be installed; the profile is validated without it" >&2
fi

export RUSTC_WRAPPER="$PWD/scripts/rustc-coverage-wrapper"
# The core's generic code (Vpmu<B>::wrmsr, handle_pmi, ...) is compiled, and counted, in the
# crates that instantiate it: the machine and the VMM libraries that pick a personality. The
# report keeps only the vPMU's own sources.
export VPMU_COVERAGE_CRATES="vpmu vpmu_abi vpmu_intel vpmu_amd vpmu_machine vpmu_selftest vpmu_coverage vpmu_profile minicov"
# Its own target directory: the instrumented crates must not mix with normal builds (and
# changing the crate list does not trigger rebuilds by itself).
export CARGO_TARGET_DIR="${VPMU_COVERAGE_TARGET_DIR:-$PWD/target/coverage}"
# Cargo's fingerprints do not see what the wrapper adds: rebuild the instrumented crates.
cargo clean --release -q -p vpmu -p vpmu-abi -p vpmu-intel -p vpmu-amd -p vpmu-cli -p vpmu-machine -p vpmu-selftest -p vpmu-coverage -p vpmu-profile -p minicov \
    2>/dev/null || true
cargo build --release -p vpmu-cli --features coverage
"$CARGO_TARGET_DIR/release/vpmu" coverage --out "$out"
