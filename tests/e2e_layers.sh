#!/usr/bin/env bash
# The layering of DESIGN.md (scripts/check_layers.sh) holds on this tree,
# and the check fails - naming the file, the line and the rule - when a
# lower layer includes a higher one: io/ including pipeline/, core/
# including io/, model/ including workflows/; or when a file outside
# pipeline/ includes its private header (pipeline/run_internal.h).
set -euo pipefail
src=${TW_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
check=$src/scripts/check_layers.sh
fail=0
out=$(bash "$check" "$src") || { echo "FAIL: the tree breaks its layering:"; echo "$out"; exit 1; }
echo "ok   $out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cases=(
  'io/bad.c|#include "pipeline/run.h"|io/bad.c:2: io/ may not include pipeline/'
  'core/bad.h|#include "io/raster.h"|core/bad.h:2: core/ may not include io/'
  'model/bad.c|  #  include "workflows/workflow.h"|model/bad.c:2: model/ may not include workflows/'
  'workflows/bad.c|#include "pipeline/run_internal.h"|workflows/bad.c:2: pipeline/run_internal.h is private to pipeline/'
  'tests/test_bad.c|#include "pipeline/run_internal.h"|tests/test_bad.c:2: pipeline/run_internal.h is private to pipeline/'
)
for c in "${cases[@]}"; do
  IFS='|' read -r file line want <<<"$c"
  rm -rf "$tmp/tree"
  mkdir -p "$tmp/tree/core" "$tmp/tree/io" "$tmp/tree/model" "$(dirname "$tmp/tree/$file")"
  printf '#include "core/error.h"\n%s\n' "$line" >"$tmp/tree/$file"
  if out=$(bash "$check" "$tmp/tree"); then
    echo "FAIL: $file with '$line' passed the check"
    fail=1
  elif grep -qF "$want" <<<"$out"; then
    echo "ok   $file with '$line' is refused: $want"
  else
    echo "FAIL: $file: the message does not say '$want': $out"
    fail=1
  fi
done
# a legal include stays legal
mkdir -p "$tmp/ok/io" "$tmp/ok/pipeline"
printf '#include "core/error.h"\n#include "io/raster.h"\n' >"$tmp/ok/io/fine.c"
printf '#include "pipeline/run_internal.h"\n' >"$tmp/ok/pipeline/merge.c"
bash "$check" "$tmp/ok" >/dev/null || { echo "FAIL: a legal include was refused"; fail=1; }
[ $fail -eq 0 ] && echo "e2e_layers: all checks passed" || exit 1
