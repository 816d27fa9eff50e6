#!/usr/bin/env bash
# Builds the Linux guest's artifacts (README.md in this directory says what they are for):
#   vmlinux               Debian's linux-source-6.1, tinyconfig + kernel.config, ELF
#   initramfs.cpio        busybox-static, /init, /bin/perftest; uncompressed newc
#   initramfs-perf.cpio   the same plus Debian's perf and every library it loads
#   initramfs-perf-static.cpio  the same as initramfs.cpio plus perf 6.1 from the kernel's
#                         source (tools/perf), linked statically: 8 MB instead of 36
# into target/linux-guest/ at the repository root, or $VPMU_LINUX_GUEST_OUT.
#
# Installs with apt what it needs and is missing (root, or sudo). Each output is rebuilt only
# when the sha256 of its inputs changed (recorded in a .key file next to it), so a second run
# with no change takes seconds. Environment: VPMU_LINUX_GUEST_OUT (output directory),
# VPMU_LINUX_GUEST_JOBS (make -j, default nproc).
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
here=$(dirname "$self")
repo=$(cd "$here/../.." && pwd)
out=${VPMU_LINUX_GUEST_OUT:-$repo/target/linux-guest}
mkdir -p "$out"
out=$(cd "$out" && pwd)
jobs=${VPMU_LINUX_GUEST_JOBS:-$(nproc)}

log() { echo "linux-guest: $*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- packages
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }
missing=()
need() { # need PACKAGE WHY
    if ! installed "$1"; then
        log "installing $1 ($2)"
        missing+=("$1")
    fi
}
need linux-source-6.1 "the kernel source, /usr/src/linux-source-6.1.tar.xz"
need xz-utils "to unpack the kernel source"
need gcc "the kernel and perftest"
need libc6-dev "perftest's static libc and linux/perf_event.h"
need make "the kernel build"
need bc "the kernel build (timeconst)"
need bison "the kernel's kconfig"
need flex "the kernel's kconfig"
need libelf-dev "the kernel's objtool"
need cpio "the initramfs archives"
need busybox-static "the guest's shell and tools"
need linux-perf "Debian's perf, copied into initramfs-perf.cpio"
need zlib1g-dev "the static perf (libz.a)"
if [ "${#missing[@]}" -gt 0 ]; then
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

sha() { sha256sum | cut -d' ' -f1; }
# The lines of this script between "# >>> NAME" and "# <<< NAME": a section's own text is part
# of its output's key, so editing one section does not rebuild the other's output.
section() { sed -n "/^# >>> $1\$/,/^# <<< $1\$/p" "$self"; }
size_of() { stat -c %s "$1"; }
human() { numfmt --to=iec-i --suffix=B "$1" 2>/dev/null || echo "$1 bytes"; }

# >>> kernel
kver=6.1
tarball=/usr/src/linux-source-$kver.tar.xz
[ -r "$tarball" ] || die "$tarball missing (package linux-source-$kver)"
srcver=$(dpkg-query -W -f='${Version}' "linux-source-$kver")
src=$out/src/linux-source-$kver
kbuild=$out/kbuild
# The source, unpacked once per package version (the kernel and the static perf use it).
unpack_source() {
    if [ "$(cat "$out/src/.version" 2>/dev/null)" != "$srcver" ] || [ ! -d "$src" ]; then
        log "unpacking $tarball ($srcver) into $out/src"
        rm -rf "$out/src" "$kbuild"
        mkdir -p "$out/src"
        tar -xJf "$tarball" -C "$out/src"
        [ -d "$src" ] || die "$tarball did not unpack to $src"
        echo "$srcver" >"$out/src/.version"
    fi
}
kernel_key=$( {
    section kernel
    # the options only: comments do not change the kernel
    grep -E '^(CONFIG_|# CONFIG_.* is not set$)' "$here/kernel.config"
    echo "linux-source-$kver $srcver"
    gcc --version | head -n1
} | sha)

if [ -f "$out/vmlinux" ] && [ "$(cat "$out/vmlinux.key" 2>/dev/null)" = "$kernel_key" ]; then
    log "vmlinux: up to date, kernel build skipped (same kernel.config, same kernel part of" \
        "build.sh, linux-source-$kver $srcver, same gcc; key ${kernel_key:0:12})"
else
    t0=$SECONDS
    unpack_source
    mkdir -p "$kbuild"
    klog=$out/kbuild.log
    : >"$klog"
    kmake() { make -C "$src" O="$kbuild" ARCH=x86_64 "$@" >>"$klog" 2>&1; }

    # tinyconfig, then the fragment merged with allnoconfig: options neither names stay off.
    log "configuring: tinyconfig + kernel.config (log $klog)"
    kmake tinyconfig || { tail -n 40 "$klog"; die "make tinyconfig failed"; }
    (cd "$kbuild" && ARCH=x86_64 "$src/scripts/kconfig/merge_config.sh" -n -O "$kbuild" \
        "$kbuild/.config" "$here/kernel.config") >>"$klog" 2>&1 \
        || { tail -n 40 "$klog"; die "merge_config.sh failed"; }

    # Every option kernel.config asks for must be in the final .config, exactly.
    bad=0
    while IFS= read -r line; do
        case "$line" in
        CONFIG_*=*)
            if ! grep -qxF -- "$line" "$kbuild/.config"; then
                name=${line%%=*}
                have=$(grep -E "^(# )?$name[= ]" "$kbuild/.config" || echo "absent")
                log "kernel.config asks for $line, the .config has: $have"
                bad=1
            fi
            ;;
        "# CONFIG_"*" is not set")
            name=${line#\# }
            name=${name%% *}
            if grep -q "^$name=" "$kbuild/.config"; then
                log "kernel.config asks for $name off, the .config has: $(grep "^$name=" "$kbuild/.config")"
                bad=1
            fi
            ;;
        esac
    done <"$here/kernel.config"
    [ "$bad" = 0 ] || die "options of kernel.config did not take effect (missing dependency" \
        "or renamed option?); merge_config.sh's report is in $klog"
    log "all $(grep -cE '^(CONFIG_|# CONFIG_.* is not set$)' "$here/kernel.config") options of kernel.config are in the .config"

    # `modules` builds no module (every option is built in or off) but runs modpost: it writes
    # Module.symvers, which an out-of-tree module (xenpmu/) is linked against.
    log "building vmlinux (make -j$jobs vmlinux modules; 3 to 4 minutes from scratch at -j2; log $klog)"
    kmake -j"$jobs" vmlinux modules || { tail -n 60 "$klog"; die "the kernel build failed"; }
    cp "$kbuild/vmlinux" "$out/vmlinux.tmp"
    mv "$out/vmlinux.tmp" "$out/vmlinux"
    cp "$kbuild/.config" "$out/vmlinux.config"
    echo "$kernel_key" >"$out/vmlinux.key"
    log "vmlinux built in $((SECONDS - t0)) s"
fi
# <<< kernel

# >>> initramfs
busybox=/bin/busybox
[ -x "$busybox" ] || die "$busybox missing (package busybox-static)"
if LC_ALL=C readelf -l "$busybox" | grep -q 'program interpreter'; then
    die "$busybox is dynamically linked: install busybox-static (it replaces busybox)"
fi
libc_a=$(gcc -print-file-name=libc.a)
# The applets /init and a person at the console use; each is a symlink to busybox.
applets="sh mount umount stty dd reboot poweroff sleep cat echo printf test [ ls dmesg mkdir
    uname sync true false grep sed tr head tail wc env id ps kill"
cflags="-O2 -static -Wall -Wextra -Werror"

initramfs_key=$( {
    section initramfs
    sha256sum "$here/init" "$here/perftest.c" "$busybox" "$libc_a" | cut -d' ' -f1
    gcc --version | head -n1
} | sha)

# Writes the tree $1 to the newc archive $2: sorted, owned by root, mtimes 0, reproducible.
make_cpio() {
    find "$1" -exec touch -h -d @0 {} +
    (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort \
        | cpio -o -H newc -R 0:0 --reproducible --quiet) >"$2.tmp"
    mv "$2.tmp" "$2"
}

base_root=$out/initramfs-root
if [ -f "$out/initramfs.cpio" ] && [ -x "$out/perftest" ] && [ -d "$base_root" ] \
    && [ "$(cat "$out/initramfs.cpio.key" 2>/dev/null)" = "$initramfs_key" ]; then
    log "initramfs.cpio: up to date, skipped (same init, perftest.c, busybox, libc.a, gcc and" \
        "initramfs part of build.sh; key ${initramfs_key:0:12})"
else
    t0=$SECONDS
    # Not stripped: perf report names hot_a and hot_b from the symbol table.
    # shellcheck disable=SC2086
    gcc $cflags -o "$out/perftest" "$here/perftest.c" -lm
    rm -rf "$base_root"
    mkdir -p "$base_root"/{bin,dev,etc,proc,sys,tmp,root,usr/bin}
    chmod 1777 "$base_root/tmp"
    cp "$busybox" "$base_root/bin/busybox"
    for a in $applets; do ln -s busybox "$base_root/bin/$a"; done
    install -m 0755 "$here/init" "$base_root/init"
    install -m 0755 "$out/perftest" "$base_root/bin/perftest"
    make_cpio "$base_root" "$out/initramfs.cpio"
    echo "$initramfs_key" >"$out/initramfs.cpio.key"
    rm -f "$out/initramfs-perf.cpio.key" # its base changed
    log "initramfs.cpio built in $((SECONDS - t0)) s"
fi

# Debian's perf: /usr/bin/perf is the ELF itself in bookworm; older releases shipped a wrapper
# script there that execs perf_<version>. Whichever it is, the ELF goes to /usr/bin/perf.
is_elf() { [ -f "$1" ] && [ "$(head -c4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }
perf_elf=
for c in /usr/bin/perf /usr/bin/perf_$kver /usr/bin/perf_*; do
    if is_elf "$c"; then perf_elf=$c; break; fi
done
[ -n "$perf_elf" ] || die "no perf ELF in /usr/bin (package linux-perf)"
# Its libraries as ldd resolves them (name => path), and the dynamic loader (a bare path).
mapfile -t perf_libs < <(ldd "$perf_elf" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | LC_ALL=C sort -u)
[ "${#perf_libs[@]}" -gt 0 ] || die "ldd found no libraries for $perf_elf"
for lib in "${perf_libs[@]}"; do [ -r "$lib" ] || die "$perf_elf needs $lib, which is missing"; done

perf_key=$( {
    echo "$initramfs_key"
    sha256sum "$perf_elf" "${perf_libs[@]}"
} | sha)
if [ -f "$out/initramfs-perf.cpio" ] \
    && [ "$(cat "$out/initramfs-perf.cpio.key" 2>/dev/null)" = "$perf_key" ]; then
    log "initramfs-perf.cpio: up to date, skipped (same base, same perf and libraries; key" \
        "${perf_key:0:12})"
else
    t0=$SECONDS
    perf_root=$out/initramfs-perf-root
    rm -rf "$perf_root"
    cp -a "$base_root" "$perf_root"
    install -m 0755 "$perf_elf" "$perf_root/usr/bin/perf"
    for lib in "${perf_libs[@]}"; do
        mkdir -p "$perf_root$(dirname "$lib")"
        cp -L "$lib" "$perf_root$lib"
    done
    make_cpio "$perf_root" "$out/initramfs-perf.cpio"
    echo "$perf_key" >"$out/initramfs-perf.cpio.key"
    log "initramfs-perf.cpio built in $((SECONDS - t0)) s ($perf_elf and ${#perf_libs[@]}" \
        "libraries with the loader)"
fi
# <<< initramfs

# >>> perf
# perf from the same source (tools/perf, 6.1 as Debian's linux-perf), linked statically with
# only what `perf stat`, `perf record` and `perf report` need: one 8 MB file instead of Debian's
# perf and its 26 libraries (36 MB), which the guest's emulated kernel unpacks at about 2.4 µs
# a byte and its dynamic loader maps page fault by page fault.
perf_make_options=(LDFLAGS=-static WERROR=0 NO_LIBPYTHON=1 NO_LIBPERL=1 NO_SLANG=1 NO_GTK2=1
    NO_LIBUNWIND=1 NO_LIBNUMA=1 NO_LIBAUDIT=1 NO_LIBCRYPTO=1 NO_LIBBPF=1 NO_JVMTI=1
    NO_LIBZSTD=1 NO_LIBCAP=1 NO_LIBBABELTRACE=1 NO_DEMANGLE=1 NO_LZMA=1 NO_DWARF=1
    NO_LIBDW_DWARF_UNWIND=1 NO_AUXTRACE=1 NO_LIBDEBUGINFOD=1 NO_SDT=1)
static_key=$( {
    section perf
    cat "$out/initramfs.cpio.key"
    echo "linux-source-$kver $srcver"
    gcc --version | head -n1
} | sha)
if [ -f "$out/initramfs-perf-static.cpio" ] \
    && [ "$(cat "$out/initramfs-perf-static.cpio.key" 2>/dev/null)" = "$static_key" ]; then
    log "initramfs-perf-static.cpio: up to date, skipped (same base, source and gcc; key" \
        "${static_key:0:12})"
else
    t0=$SECONDS
    unpack_source
    plog=$out/perfbuild.log
    mkdir -p "$out/perfbuild"
    log "building a static perf from $src/tools/perf (log $plog)"
    make -C "$src/tools/perf" -f Makefile.perf O="$out/perfbuild" -j"$jobs" \
        "${perf_make_options[@]}" "$out/perfbuild/perf" >"$plog" 2>&1 \
        || { tail -n 40 "$plog"; die "the static perf build failed"; }
    strip -o "$out/perf" "$out/perfbuild/perf"
    static_root=$out/initramfs-perf-static-root
    rm -rf "$static_root"
    cp -a "$base_root" "$static_root"
    install -m 0755 "$out/perf" "$static_root/usr/bin/perf"
    make_cpio "$static_root" "$out/initramfs-perf-static.cpio"
    echo "$static_key" >"$out/initramfs-perf-static.cpio.key"
    log "initramfs-perf-static.cpio built in $((SECONDS - t0)) s (perf $(human "$(size_of "$out/perf")"))"
fi
# <<< perf

# >>> xenpmu
# The xenpmu driver (xenpmu/, GPL-2.0), built out of tree with Kbuild against the kernel
# above, in a copy of its directory (Kbuild writes its objects next to the sources), at
# -Werror; the recorder /bin/xenpmu-record (xenpmu/record.c, static, native user space); and
# initramfs-xenpmu.cpio: the base archive plus /lib/modules/xenpmu.ko, /bin/xenpmu-test (the
# step `xenpmu` of /init), /bin/xenpmu-record (the step `record`) and busybox's insmod, rmmod
# and lsmod. The recorder includes guest_protocol.h, which the vpmu-guests crate generates from
# vmm/protocol when it is built (any cargo build of the VMM): the newest one under target/.
abi_include=$repo/abi/include
find_protocol_header() {
    find "$repo/target" -path '*/build/vpmu-guests-*/out/guest_protocol.h' -printf '%T@ %p\n' \
        2>/dev/null | sort -n | tail -n1 | cut -d' ' -f2-
}
protocol_h=$(find_protocol_header)
if [ -z "$protocol_h" ]; then
    log "no generated guest_protocol.h under $repo/target: building vpmu-guests (cargo build --release -p vpmu-guests)"
    (cd "$repo" && cargo build --release -p vpmu-guests) >&2 || die "cargo build -p vpmu-guests failed"
    protocol_h=$(find_protocol_header)
    [ -n "$protocol_h" ] || die "cargo build -p vpmu-guests wrote no guest_protocol.h"
fi
xenpmu_key=$( {
    section xenpmu
    cat "$out/vmlinux.key" "$out/initramfs.cpio.key"
    sha256sum "$here"/xenpmu/* "$abi_include/xenpmu.h" "$protocol_h" "$libc_a" | cut -d' ' -f1
    gcc --version | head -n1
} | sha)
if [ -f "$out/initramfs-xenpmu.cpio" ] && [ -f "$out/xenpmu.ko" ] && [ -x "$out/xenpmu-record" ] \
    && [ "$(cat "$out/initramfs-xenpmu.cpio.key" 2>/dev/null)" = "$xenpmu_key" ]; then
    log "initramfs-xenpmu.cpio: up to date, skipped (same kernel, base, xenpmu/, xenpmu.h and guest_protocol.h;" \
        "key ${xenpmu_key:0:12})"
else
    t0=$SECONDS
    [ -f "$kbuild/Module.symvers" ] || die "$kbuild/Module.symvers missing: the kernel build" \
        "did not finish (remove $out/vmlinux.key and run again)"
    mbuild=$out/xenpmu-build
    mlog=$out/xenpmu-build.log
    rm -rf "$mbuild"
    mkdir -p "$mbuild"
    cp "$here"/xenpmu/Kbuild "$here"/xenpmu/*.c "$here"/xenpmu/*.h "$mbuild/"
    rm "$mbuild/record.c" # user space: not part of the module
    make -C "$kbuild" ARCH=x86_64 M="$mbuild" XENPMU_INCLUDE="$abi_include" modules \
        >"$mlog" 2>&1 || { tail -n 40 "$mlog"; die "the xenpmu module build failed (log $mlog)"; }
    cp "$mbuild/xenpmu.ko" "$out/xenpmu.ko"
    # shellcheck disable=SC2086
    gcc $cflags -I"$abi_include" -I"$(dirname "$protocol_h")" -I"$here/xenpmu" \
        -o "$out/xenpmu-record" "$here/xenpmu/record.c" \
        || die "building xenpmu-record (xenpmu/record.c) failed"
    xenpmu_root=$out/initramfs-xenpmu-root
    rm -rf "$xenpmu_root"
    cp -a "$base_root" "$xenpmu_root"
    mkdir -p "$xenpmu_root/lib/modules"
    install -m 0644 "$out/xenpmu.ko" "$xenpmu_root/lib/modules/xenpmu.ko"
    install -m 0755 "$here/xenpmu/xenpmu-test" "$xenpmu_root/bin/xenpmu-test"
    install -m 0755 "$out/xenpmu-record" "$xenpmu_root/bin/xenpmu-record"
    for a in insmod rmmod lsmod; do ln -s busybox "$xenpmu_root/bin/$a"; done
    make_cpio "$xenpmu_root" "$out/initramfs-xenpmu.cpio"
    echo "$xenpmu_key" >"$out/initramfs-xenpmu.cpio.key"
    log "xenpmu.ko and initramfs-xenpmu.cpio built in $((SECONDS - t0)) s (log $mlog)"
fi
# <<< xenpmu

for f in vmlinux initramfs.cpio initramfs-perf.cpio initramfs-perf-static.cpio \
    initramfs-xenpmu.cpio xenpmu.ko; do
    printf '%s\t%s (%s)\n' "$out/$f" "$(size_of "$out/$f")" "$(human "$(size_of "$out/$f")")"
done
echo "kernel command line: $(cat "$here/cmdline")"
