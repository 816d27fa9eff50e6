#!/usr/bin/env bash
# CI: every cargo-fuzz target (fuzz/) over its committed corpus, for a fixed budget each
# (FUZZ_SECONDS, default 30), failing on any crash, panic, leak or timeout. First the corpus
# test (plain `cargo test` in fuzz/, no nightly): the committed seeds are the generated ones
# and each target reaches its deep paths. cargo-fuzz's -Z flags (sanitizer, coverage
# instrumentation) run on the stable compiler through RUSTC_BOOTSTRAP=1, so CI needs no nightly;
# if the instrumented build cannot be made, the fuzzing runs are skipped loudly (the corpus test
# has run).
# Regenerates nothing: new inputs go to a scratch directory, never into fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

CARGO_FUZZ_VERSION=0.13.2
seconds=${FUZZ_SECONDS:-30}
targets=(flush_verify guest_msr page_view profile_batch coverage_profile core_world ring_reader ring_producer snapshot_decode)

cargo test --release --locked

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

export RUSTC_BOOTSTRAP=1
# Release code with debug assertions (overflow checks) and AddressSanitizer.
flags=(-O --debug-assertions)
# Skip (loudly) only when this compiler cannot make an instrumented build at all; once it can,
# a target that does not build fails the run.
probe=$(mktemp -d)
echo 'fn main() {}' >"$probe/probe.rs"
if ! rustc -Zsanitizer=address -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    --edition 2021 -o "$probe/probe" "$probe/probe.rs" 2>"$probe/err"; then
    echo "SKIPPED: $(rustc --version) cannot build with libFuzzer's instrumentation even with RUSTC_BOOTSTRAP=1: no fuzzing run" | tee /dev/stderr
    cat "$probe/err" >&2
    rm -rf "$probe"
    exit 0
fi
rm -rf "$probe"
cargo fuzz build "${flags[@]}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    echo "fuzz: $target for ${seconds}s over corpus/$target"
    # Deep paths of the committed corpus, as the instrumented binary reaches them.
    VPMU_FUZZ_REACHED=1 cargo fuzz run "${flags[@]}" "$target" "corpus/$target" \
        -- -runs=0 2>&1 | grep '^reached: ' || { echo "fuzz: $target failed over its corpus or reached no deep path"; exit 1; }
    status=0
    cargo fuzz run "${flags[@]}" "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$scratch/" >"$scratch/$target.log" 2>&1 || status=$?
    # libFuzzer's last status line (executions, cov: edges, ft: features) and its final stats.
    grep -E '^#[0-9]+' "$scratch/$target.log" | tail -n 1
    grep '^stat::' "$scratch/$target.log" || true
    if [ "$status" -ne 0 ]; then
        echo "fuzz: $target failed (status $status):" >&2
        grep -v '^#[0-9]' "$scratch/$target.log" | tail -n 60 >&2
        for artifact in "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-*; do
            if [ -e "$artifact" ]; then
                echo "$artifact (base64):" >&2
                base64 -w0 "$artifact" >&2
                echo >&2
            fi
        done
        exit "$status"
    fi
done
