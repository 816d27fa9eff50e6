#!/usr/bin/env bash
# Installs what the tests need beyond a Rust toolchain: gcc and g++ with 32-bit support, used
# to compile the C binding as C11 and C++11 at -m32 and -m64; Debian's kernel headers
# (linux-headers-amd64, which pulls the gcc the kernel was built with), against which a kernel
# module including the binding is built; clang, with which the minicov crate (the `coverage`
# feature, on under --all-features) builds LLVM's profile runtime; Linux perf and Go, whose
# `perf report`/`perf script` and `go tool pprof` the profile tests run on the outputs of
# `vpmu profile`. Idempotent; does nothing when all are there.
set -euo pipefail

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdint.h>\n#include <stdio.h>\nint main(void){return (int)sizeof(uint64_t)-8;}\n' >"$probe/p.c"
printf '#include <cstdint>\n#include <cstdio>\nint main(){return (int)sizeof(std::uint64_t)-8;}\n' >"$probe/p.cpp"

if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
updated=""
install() {
    if [ -z "$updated" ]; then
        $sudo apt-get update -qq
        updated=1
    fi
    $sudo apt-get install -y -qq "$@" >/dev/null
}

if ! { gcc -m32 "$probe/p.c" -o "$probe/p32" 2>/dev/null && gcc -m64 "$probe/p.c" -o "$probe/p64" 2>/dev/null; }; then
    echo "setup: installing gcc-multilib (needed to test the C binding at -m32)" >&2
    install gcc gcc-multilib
    gcc -m32 "$probe/p.c" -o "$probe/p32"
    echo "setup: gcc -m32 works" >&2
fi

# The C API's toy hypervisor (capi/tests/c) is also run under AddressSanitizer and
# UndefinedBehaviorSanitizer; gcc links them from libasan and libubsan.
if ! gcc -fsanitize=address,undefined "$probe/p.c" -o "$probe/psan" 2>/dev/null; then
    echo "setup: installing libasan8 and libubsan1 (the C API test runs under ASan/UBSan)" >&2
    install libasan8 libubsan1
    gcc -fsanitize=address,undefined "$probe/p.c" -o "$probe/psan"
fi

if ! { g++ -m32 "$probe/p.cpp" -o "$probe/pp32" 2>/dev/null && g++ -m64 "$probe/p.cpp" -o "$probe/pp64" 2>/dev/null; }; then
    echo "setup: installing g++-multilib (needed to test the C binding as C++11 at -m32)" >&2
    install g++ g++-multilib
    g++ -m32 "$probe/p.cpp" -o "$probe/pp32"
    echo "setup: g++ -m32 works" >&2
fi

if ! compgen -G "/usr/src/linux-headers-*-amd64/Makefile" >/dev/null || ! command -v make >/dev/null; then
    echo "setup: installing linux-headers-amd64 and make (a kernel module including the C binding is built against them)" >&2
    install linux-headers-amd64 make
fi

if ! command -v clang >/dev/null; then
    echo "setup: installing clang (minicov, the coverage feature's runtime, is built with it)" >&2
    install clang
fi

# `vpmu profile`'s tests open its perf.data with the real perf and its profile.pb.gz with
# go tool pprof.
if ! command -v perf >/dev/null || ! perf --version >/dev/null 2>&1; then
    echo "setup: installing linux-perf (the profile tests read perf.data with perf report/script)" >&2
    install linux-perf
fi
if ! command -v go >/dev/null; then
    echo "setup: installing golang-go (the profile tests read profile.pb.gz with go tool pprof)" >&2
    install golang-go
fi
