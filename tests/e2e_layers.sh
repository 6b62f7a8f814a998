#!/usr/bin/env bash
# The layering of DESIGN.md (scripts/check_layers.sh) holds on this tree,
# and the check fails - naming the file, the line and the rule - when a
# lower layer includes a higher one: io/ including pipeline/, core/
# including io/, model/ including workflows/; when a lower floor of io/ or
# pipeline/ includes a higher one or a sibling (pipeline/store/ including
# pipeline/run/, io/input/ including io/output/); when the CLI (workflows/)
# includes anything of the library but tilewise.h; or when a file outside
# pipeline/ includes its private header (pipeline/run/run_internal.h; the
# same for model/cpu_internal.h outside model/).
set -euo pipefail
src=${TW_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
check=$src/scripts/check_layers.sh
fail=0
out=$(bash "$check" "$src") || { echo "FAIL: the tree breaks its layering:"; echo "$out"; exit 1; }
echo "ok   $out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cases=(
  'io/bad.c|#include "pipeline/run/run.h"|io/bad.c:2: io/ may not include pipeline/'
  'core/bad.h|#include "io/input/raster.h"|core/bad.h:2: core/ may not include io/'
  'model/bad.c|  #  include "workflows/workflow.h"|model/bad.c:2: model/ may not include workflows/'
  'api/bad.c|#include "workflows/submit.h"|api/bad.c:2: api/ may not include workflows/'
  'config/bad.c|#include "api/info.h"|config/bad.c:2: config/ may not include api/'
  'pipeline/bad.c|#include "config/workflow.h"|pipeline/bad.c:2: pipeline/ may not include config/'
  'workflows/bad.c|#include "api/validate.h"|workflows/bad.c:2: workflows/ may not include api/'
  'workflows/submit.c|#include "pipeline/run/run.h"|workflows/submit.c:2: workflows/ may not include pipeline/'
  'workflows/main.c|#include "core/params.h"|workflows/main.c:2: workflows/ may not include core/'
  'workflows/bad.c|#include "pipeline/run/run_internal.h"|workflows/bad.c:2: pipeline/run/run_internal.h is private to pipeline/run/'
  'tests/test_bad.c|#include "pipeline/run/run_internal.h"|tests/test_bad.c:2: pipeline/run/run_internal.h is private to pipeline/run/'
  'pipeline/engine/bad.c|#include "pipeline/store/parts_internal.h"|pipeline/engine/bad.c:2: pipeline/store/parts_internal.h is private to pipeline/store/'
  'pipeline/bad.c|#include "model/cpu_internal.h"|pipeline/bad.c:2: model/cpu_internal.h is private to model/'
  'pipeline/store/bad.c|#include "pipeline/run/run.h"|pipeline/store/bad.c:2: pipeline/store/ may not include pipeline/run/'
  'pipeline/engine/bad.h|#include "pipeline/report/report.h"|pipeline/engine/bad.h:2: pipeline/engine/ may not include pipeline/report/'
  'pipeline/bad.h|#include "pipeline/store/parts.h"|pipeline/bad.h:2: pipeline/ may not include pipeline/store/'
  'pipeline/extra/bad.c|#include "pipeline/store/parts.h"|pipeline/extra/bad.c:2: pipeline/extra/ is no floor of pipeline/'
  'io/input/bad.c|#include "io/output/writer.h"|io/input/bad.c:2: io/input/ may not include io/output/'
  'io/modelfile/bad.c|#include "io/input/raster.h"|io/modelfile/bad.c:2: io/modelfile/ may not include io/input/'
  'io/bad.c|#include "io/input/raster.h"|io/bad.c:2: io/ may not include io/input/'
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
mkdir -p "$tmp/ok/io/input" "$tmp/ok/io/output" "$tmp/ok/pipeline/run" "$tmp/ok/pipeline/store"
printf '#include "core/error.h"\n#include "io/gdal_msgs.h"\n' >"$tmp/ok/io/input/fine.c"
printf '#include "io/input/raster.h"\n#include "io/url.h"\n' >"$tmp/ok/io/output/fine.c"
printf '#include "pipeline/run/run_internal.h"\n#include "pipeline/report/report.h"\n' >"$tmp/ok/pipeline/run/merge.c"
printf '#include "pipeline/resolved.h"\n#include "io/output/writer.h"\n' >"$tmp/ok/pipeline/store/fine.c"
mkdir -p "$tmp/ok/model"
printf '#include "model/cpu_internal.h"\n' >"$tmp/ok/model/cpu_plan.c"
bash "$check" "$tmp/ok" >/dev/null || { echo "FAIL: a legal include was refused"; fail=1; }
# nothing of the CLI is in the library: libtilewise.so holds no object of
# workflows/ (submit, shard) and exports only the public API
so=$(dirname "${TW_BIN:-}")/libtilewise.so
if [ -n "${TW_BIN:-}" ] && [ -e "$so" ] && command -v nm >/dev/null; then
  cli=$(nm "$so" 2>/dev/null | grep -E ' (tw_cli_|tw_shard_resolve|tw_submit)' || true)
  exported=$(nm -D --defined-only "$so" | awk '$2 != "A" {print $3}' | grep -v '^tilewise_' | grep -v '^_' || true)
  if [ -n "$cli" ]; then
    echo "FAIL: libtilewise.so holds CLI code: $cli"
    fail=1
  elif [ -n "$exported" ]; then
    echo "FAIL: libtilewise.so exports more than tilewise_*: $exported"
    fail=1
  else
    echo "ok   libtilewise.so holds no CLI code and exports tilewise_* only"
  fi
else
  echo "note: no libtilewise.so beside TW_BIN: the symbol check is skipped"
fi
# no circle between files of different jobs (issue 35): each pair below
# called each other once; now one calls the other, never back (the objects'
# symbols: what one defines and the other uses). advice.c (the advice)
# includes nothing of preflight (the output checks).
objs=$(dirname "${TW_BIN:-}")/CMakeFiles/tilewise_obj.dir
if [ -n "${TW_BIN:-}" ] && [ -d "$objs" ] && command -v nm >/dev/null; then
  for pair in api/info.c:api/info_stac.c api/info.c:api/info_tree.c api/info_stac.c:api/info_tree.c \
              io/output/polygons.c:io/output/polygons_label.c \
              io/output/polygons.c:io/output/polygons_simplify.c \
              io/output/stac_out.c:io/output/stac_items.c; do
    a=$objs/${pair%%:*}.o b=$objs/${pair#*:}.o
    [ -e "$a" ] && [ -e "$b" ] || continue
    ab=$(comm -12 <(nm -u "$a" | awk '{print $2}' | sort -u) <(nm --defined-only "$b" | awk '{print $3}' | sort -u))
    ba=$(comm -12 <(nm -u "$b" | awk '{print $2}' | sort -u) <(nm --defined-only "$a" | awk '{print $3}' | sort -u))
    if [ -n "$ab" ] && [ -n "$ba" ]; then
      echo "FAIL: ${pair%%:*} and ${pair#*:} call each other (${ab//$'\n'/ } / ${ba//$'\n'/ })"
      fail=1
    fi
  done
  [ $fail -eq 0 ] && echo "ok   no circle between info, its tree and STAC; polygons and its steps; the STAC item and items.json"
fi
if grep -q '#include "pipeline/run/preflight.h"' "$src/pipeline/run/advice.c"; then
  echo "FAIL: pipeline/run/advice.c includes pipeline/run/preflight.h (the padding share is advice's)"
  fail=1
fi
[ $fail -eq 0 ] && echo "e2e_layers: all checks passed" || exit 1
