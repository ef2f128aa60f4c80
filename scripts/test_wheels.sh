#!/usr/bin/env bash
# Installs the x86_64 manylinux wheel from dist/ into a fresh venv of each of
# CPython 3.10-3.13 and runs the research example there (it starts a run that
# pauses, resumes it in a fresh process and prints its trace).
#
# Nothing may be compiled: the install is `--only-binary=:all:` with no cargo,
# rustc, C compiler or pkg-config on PATH, so neither a Rust toolchain nor
# SQLite's development files can take part. Each venv must import composeai
# from its own site-packages and use the SQLite its sqlite3 module loaded.
#
#   WHEEL_OUT      where the wheel is (default: dist)
#   WHEEL_PYTHONS  space-separated interpreters (default: CPython 3.10-3.13 from
#                  pyenv, else python3.10 ... python3.13 on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

wheel="$(ls -t "${WHEEL_OUT:-dist}"/composeai-*-manylinux*_x86_64.whl 2> /dev/null | head -n 1)"
if [ -z "$wheel" ]; then
    echo "no x86_64 manylinux wheel in ${WHEEL_OUT:-dist}/: run scripts/wheels.sh first" >&2
    exit 1
fi
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"

find_python() {
    local root
    root="$(pyenv root 2> /dev/null || echo "$HOME/.pyenv")"
    ls -d "$root/versions/$1".*/bin/python 2> /dev/null | sort -V | tail -n 1 && return
    command -v "python$1"
}
pythons="${WHEEL_PYTHONS:-}"
if [ -z "$pythons" ]; then
    for v in 3.10 3.11 3.12 3.13; do
        py="$(find_python "$v" || true)"
        if [ -z "$py" ]; then
            echo "CPython $v not found (set WHEEL_PYTHONS)" >&2
            exit 1
        fi
        pythons="$pythons $py"
    done
fi

# PATH without any directory holding a compiler or a build tool.
clean_path=""
IFS=: read -r -a dirs <<< "$PATH"
for d in "${dirs[@]}"; do
    skip=""
    for tool in cargo rustc cc gcc pkg-config zig maturin; do
        [ -x "$d/$tool" ] && skip=1
    done
    [ -z "$skip" ] && clean_path="${clean_path:+$clean_path:}$d"
done

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
passed=0
failed=0
for py in $pythons; do
    version="$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
    venv="$scratch/venv-$version"
    echo "== CPython $version: fresh venv, wheel $(basename "$wheel")"
    start=$SECONDS
    if (
        set -e
        "$py" -m venv "$venv"
        export PATH="$venv/bin:$clean_path"
        unset PYTHONPATH VIRTUAL_ENV
        cd "$scratch"
        for tool in cargo rustc cc gcc pkg-config; do
            if command -v "$tool" > /dev/null; then
                echo "$tool is still on PATH" >&2
                exit 1
            fi
        done
        python -m pip install --quiet --disable-pip-version-check --only-binary=:all: "$wheel"
        python - << 'PY'
import sqlite3
import composeai
from composeai import _core

assert "site-packages" in composeai.__file__, composeai.__file__
origin, path, version = _core.sqlite_library()
assert origin == "sqlite3 module" and version == sqlite3.sqlite_version, (origin, version)
print(f"composeai from {composeai.__file__}; SQLite {version} from {path} ({origin})")
PY
        # Only shell builtins from here: coreutils' directory is off PATH too.
        out="$(python "$repo/examples/research/demo.py")"
        if [[ $out != *$'\nstatus: paused\n'*$'\nstatus: completed\n'* ]]; then
            echo "$out"
            exit 1
        fi
        echo "research example: paused, resumed in a fresh process, completed"
    ); then
        echo "== CPython $version: ok ($((SECONDS - start)) s)"
        passed=$((passed + 1))
    else
        echo "== CPython $version: FAILED"
        failed=$((failed + 1))
    fi
done
echo "wheels: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
