#!/usr/bin/env bash
# Fails if a binary of ours binds a C++ standard library symbol (std::...) to LibTorch instead of libstdc++.
#   scripts/check_std_bindings.sh BUILD_DIR
# Why: pip's LibTorch 2.x exports its own copies of std:: functions (all of std::filesystem, some string and stream
# members); a call of ours bound there crashed on the GPU machine (std::filesystem::remove_all, issue 22). Two checks:
# 1. As built (dynamic): each app, benchmark and pi0_tests is loaded the way `ldd -r` does it (LD_TRACE_LOADED_OBJECTS,
#    LD_BIND_NOW: every symbol resolved, nothing run) with LD_DEBUG=bindings; any std:: symbol that libstdc++ defines
#    and that one of our files (anything under BUILD_DIR) binds to libtorch*/libc10* instead fails. This is what the
#    link order of this build gives.
# 2. Whatever the link order (static): the apps and benchmarks import no std::filesystem operation at all (they use
#    pi0::posix_fs, src/pi0/common/fs.h), so a build whose link order puts LibTorch first still cannot reach those.
# Registered as the ctest `std_symbol_bindings` (tests/CMakeLists.txt). Exit 0 clean, 1 found, 2 usage.
set -uo pipefail
BUILD="${1:?usage: scripts/check_std_bindings.sh BUILD_DIR}"
[ -d "$BUILD" ] || { echo "check_std_bindings: no build directory '$BUILD'" >&2; exit 2; }
BUILD="$(cd "$BUILD" && pwd -P)"
command -v nm >/dev/null && command -v c++filt >/dev/null || { echo "check_std_bindings: needs nm and c++filt (binutils)" >&2; exit 2; }

bins=()
for f in "$BUILD"/pi0-* "$BUILD"/bench_* "$BUILD"/tests/pi0_tests; do
  [ -f "$f" ] && [ -x "$f" ] && head -c4 "$f" | grep -q 'ELF' && bins+=("$f")
done
[ ${#bins[@]} -gt 0 ] || { echo "check_std_bindings: no binaries in $BUILD (build first)" >&2; exit 2; }

tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
for b in "${bins[@]}"; do
  name="${b#$BUILD/}"
  # What libstdc++ itself defines: a std:: symbol only LibTorch defines (a specialization of its own) is not a finding.
  stdcxx=$(LD_TRACE_LOADED_OBJECTS=1 "$b" 2>/dev/null | awk '/libstdc\+\+\.so/ {print $3; exit}')
  [ -f "$stdcxx" ] || { echo "FAIL $name: does not load libstdc++ (ldd)"; fail=1; continue; }
  nm -D --defined-only "$stdcxx" | awk '{print $NF}' | sed 's/@.*//' | sort -u > "$tmp/stdcxx"
  LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT="$tmp/log" "$b" > /dev/null 2>&1
  cat "$tmp"/log.* > "$tmp/all" 2>/dev/null; rm -f "$tmp"/log.*
  # "binding file <from> [0] to <to> [0]: normal symbol `<sym>' [<version>]"
  ours=$(awk -v build="$BUILD/" '$2 == "binding" && index($4, build) == 1' "$tmp/all")
  n_std=$(printf '%s\n' "$ours" | grep -c "symbol \`_Z\(N\|NK\)\?St" || true)
  # A toolchain that links libstdc++ statically (cmake/stdcxx_first.cmake) leaves no std:: symbol of ours to bind
  # at load time when the archive came ahead of LibTorch; any it left undefined binds below and is judged the same.
  static_stdcxx=0
  readelf -d "$b" 2>/dev/null | grep -q 'NEEDED.*libstdc++\.so' || static_stdcxx=1
  if [ "$n_std" = 0 ] && [ $static_stdcxx = 1 ]; then
    if [ -z "$ours" ]; then
      echo "FAIL $name: LD_DEBUG=bindings showed no binding from it at all (the check saw nothing; glibc's ld.so needed)"
      fail=1; continue
    fi
    echo "ok   $name: libstdc++ linked statically, no std:: symbol left to bind at load time"
  elif [ "$n_std" = 0 ]; then
    echo "FAIL $name: LD_DEBUG=bindings showed no std:: binding from it at all (the check saw nothing; glibc's ld.so needed)"
    fail=1; continue
  fi
  bad=$(printf '%s\n' "$ours" | grep -E "to [^ ]*/lib(torch[a-z_]*|c10[a-z_]*)\.so[^ ]* \[[0-9]+\]: normal symbol \`_Z(N|NK)?St" \
        | sed -E 's/.*binding file ([^ ]*) .* to ([^ ]*) .*symbol `([^'"'"']*)'"'"'.*/\1 -> \2: \3/' | sort -u \
        | awk 'NR == FNR { std[$1] = 1; next } ($4 in std)' "$tmp/stdcxx" -)
  if [ -n "$bad" ]; then
    echo "FAIL $name binds $(printf '%s\n' "$bad" | wc -l) std:: symbol(s) to LibTorch (link order puts it before libstdc++):"
    printf '%s\n' "$bad" | head -20 | while read -r from _ to sym; do
      echo "  ${from#$BUILD/} -> $(basename "$to") $(echo "$sym" | c++filt)"
    done
    fail=1
  elif [ "$n_std" != 0 ]; then
    echo "ok   $name: $n_std std:: bindings, none to LibTorch"
  fi
  case "$name" in
    tests/*) ;;  # the tests may use std::filesystem themselves; the library code in them is checked via the apps
    *)
      ops=$(nm -D --undefined-only "$b" | awk '{print $NF}' | sed 's/@.*//' | c++filt \
            | grep -E '^std::filesystem::' | grep -Ev '^std::filesystem::(__cxx11::)?(path|filesystem_error)::' || true)
      if [ -n "$ops" ]; then
        echo "FAIL $name imports std::filesystem operations (use pi0::posix_fs, src/pi0/common/fs.h):"
        printf '%s\n' "$ops" | sed 's/^/  /' | head -20
        fail=1
      fi ;;
  esac
done
exit $fail
