#!/usr/bin/env bash
# The core's hot paths in instructions (deterministic, callgrind): installs valgrind if it is
# missing, builds the scenario binary in release mode and prints the Markdown table that
# docs/measurements.md quotes (tests/src/bin/instructions/main.rs says what each row measures, reference.rs
# each row's must-change minimum, Xen figure and budget). It fails if a calibration run does
# not come out at 0 or a scenario does not exercise what its name says; a row over its budget
# is printed as "not met", not an error.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    echo "instructions: installing valgrind" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind >&2
fi
cargo build -q --release -p vpmu-tests --bin instructions
exec target/release/instructions table
