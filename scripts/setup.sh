#!/usr/bin/env bash
# Installs what the tests need beyond a Rust toolchain: gcc with 32-bit support, used to
# compile the C binding at -m32 and -m64. Idempotent; does nothing when it is already there.
set -euo pipefail

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdint.h>\n#include <stdio.h>\nint main(void){return (int)sizeof(uint64_t)-8;}\n' >"$probe/p.c"

if gcc -m32 "$probe/p.c" -o "$probe/p32" 2>/dev/null && gcc -m64 "$probe/p.c" -o "$probe/p64" 2>/dev/null; then
    exit 0
fi

echo "setup: installing gcc-multilib (needed to test the C binding at -m32)" >&2
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq gcc gcc-multilib >/dev/null
gcc -m32 "$probe/p.c" -o "$probe/p32"
echo "setup: gcc -m32 works" >&2
