#!/usr/bin/env bash
# No library function over 100 lines (scripts/check_functions.sh) on this
# tree outside the script's allowlist, and the check fails - naming the file,
# the line, the function and its length - on a synthetic 120-line function,
# passes one of exactly 100 lines, and lets an allowlisted one through.
set -euo pipefail
src=${TW_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
check=$src/scripts/check_functions.sh
fail=0
out=$(bash "$check" "$src") || { echo "FAIL: the tree has long functions:"; echo "$out"; exit 1; }
echo "ok   $(tail -n 1 <<<"$out")"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# write_fn FILE NAME LINES: a function NAME whose braces span LINES lines,
# laid out as clang-format does, after a short one and a struct
write_fn() {
  mkdir -p "$(dirname "$1")"
  {
    printf '#include "core/error.h"\n\nstruct s {\n    int a;\n};\n\n'
    printf 'static int short_one(void)\n{\n    return 0;\n}\n\n'
    printf 'static tw_status %s(const char *path,\n' "$2"
    printf '                   int n)\n{\n'
    for ((i = 0; i < $3 - 3; i++)); do printf '    n += %d;\n' "$i"; done
    printf '    return n;\n}\n'
  } >"$1"
}
write_fn "$tmp/long/io/input/bad.c" read_all 120
if out=$(bash "$check" "$tmp/long"); then
  echo "FAIL: a 120-line function passed the check: $out"
  fail=1
elif grep -qF "io/input/bad.c:12: read_all is 120 lines (limit 100)" <<<"$out"; then
  echo "ok   a 120-line function is refused: $(head -n 1 <<<"$out")"
else
  echo "FAIL: the message does not name io/input/bad.c:12, read_all and 120 lines: $out"
  fail=1
fi
# a signature that starts with __attribute__ (printf formats) is named by
# its function, not by the attribute
mkdir -p "$tmp/attr/config"
{
  printf '__attribute__((format(printf, 3, 4))) static tw_status\n'
  printf 'fail_at(const wf_ctx *c, int line, const char *fmt, ...)\n{\n'
  for ((i = 0; i < 110; i++)); do printf '    line += %d;\n' "$i"; done
  printf '    return 0;\n}\n'
} >"$tmp/attr/config/bad.c"
if out=$(bash "$check" "$tmp/attr"); then
  echo "FAIL: a 113-line function passed the check: $out"
  fail=1
elif grep -qF "config/bad.c:2: fail_at is 113 lines" <<<"$out"; then
  echo "ok   a function after __attribute__ is named: $(head -n 1 <<<"$out")"
else
  echo "FAIL: the message does not name config/bad.c:2 fail_at, 113 lines: $out"
  fail=1
fi
write_fn "$tmp/edge/config/fine.c" read_all 100
if out=$(bash "$check" "$tmp/edge"); then
  echo "ok   a 100-line function passes"
else
  echo "FAIL: a 100-line function was refused: $out"
  fail=1
fi
# outside the library's folders (tests/) nothing is checked
write_fn "$tmp/tests_only/tests/test_long.c" long_test 300
bash "$check" "$tmp/tests_only" >/dev/null || { echo "FAIL: tests/ was checked"; fail=1; }
# an allowlisted function (the list is empty now: TW_FUNCTION_ALLOW adds one) is let through
write_fn "$tmp/listed/pipeline/run/run.c" run_scoped 150
if out=$(TW_FUNCTION_ALLOW=pipeline/run/run.c:run_scoped bash "$check" "$tmp/listed") &&
  grep -q "^allowed pipeline/run/run.c:12: run_scoped" <<<"$out"; then
  echo "ok   an allowlisted function is named and let through"
else
  echo "FAIL: the allowlisted run_scoped was not let through: $out"
  fail=1
fi
[ $fail -eq 0 ] && echo "e2e_functions: all checks passed" || exit 1
