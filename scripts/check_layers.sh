#!/usr/bin/env bash
# check_layers.sh [ROOT] - the layering of DESIGN.md, checked on every
# #include "folder/file.h" of the C and CUDA sources under ROOT (default:
# the repository):
#   core/      includes core/ only
#   io/        core/, io/
#   model/     core/, io/, model/
#   cuda/      core/, io/, model/, cuda/      (behind the backend seam)
#   pipeline/  core/, io/, model/, pipeline/
#   config/    core/, io/, model/, pipeline/, config/   (the YAML parser)
#   api/       core/, io/, model/, pipeline/, config/, api/   (the library's door)
#   workflows/ workflows/ only   (the CLI: a client of the library as any
#              program is, through tilewise.h, which has no folder)
# (tests/, fuzz/, bench/ may include anything.) Inside io/ and pipeline/,
# folders are floors along a run's data, lowest first; a file may include
# its own folder and lower floors, never a higher floor nor a sibling on
# its own floor (files directly in io/ or pipeline/ are the floor below
# all of the folder's subfolders):
#   io/        io/ (GDAL glue: messages, paths)  <  input/, modelfile/
#              <  output/ (products are written on an input's geometry)
#   pipeline/  pipeline/ (what a run resolves and reports: types)  <  store/
#              (chunks, manifest, names)  <  engine/ (plan, budget, stages)
#              <  report/ (result, run.json, STAC)  <  run/ (the drivers)
# A private header,
# FOLDER/*_internal.h (pipeline/run/run_internal.h, pipeline/engine/
# stages_internal.h, cuda/cuda_internal.h, pipeline/store/
# parts_internal.h, model/cpu_internal.h, api/api_internal.h), is included
# from its own folder (subfolders included) only, wherever the includer
# lives (tests/ and the bindings too). Prints one line per
# violation - FILE:LINE: who may not include what - and exits 1 if any.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
declare -A allowed=(
  [core]="core"
  [io]="core io"
  [model]="core io model"
  [cuda]="core io model cuda"
  [pipeline]="core io model pipeline"
  [config]="core io model pipeline config"
  [api]="core io model pipeline config api"
  [workflows]="workflows"
)
# Floors inside io/ and pipeline/: folder -> rank (equal ranks are siblings).
declare -A floor=(
  [io]=0 [io/input]=1 [io/modelfile]=1 [io/output]=2
  [pipeline]=0 [pipeline/store]=1 [pipeline/engine]=2 [pipeline/report]=3 [pipeline/run]=4
)
floors_of() {
  case $1 in
    io) echo "io/ < io/input/, io/modelfile/ < io/output/" ;;
    pipeline) echo "pipeline/ < pipeline/store/ < pipeline/engine/ < pipeline/report/ < pipeline/run/" ;;
  esac
}
# The floor folder of a path inside io/ or pipeline/: its first two
# components when the file is in a subfolder, else the top folder.
floor_dir() {
  local top=${1%%/*} rest=${1#*/}
  case $rest in */*) echo "$top/${rest%%/*}" ;; *) echo "$top" ;; esac
}
bad=0
checked=0
for layer in core io model cuda pipeline config api workflows; do
  [ -d "$root/$layer" ] || continue
  while IFS= read -r -d '' f; do
    checked=$((checked + 1))
    while IFS=: read -r line target; do
      [ -n "$target" ] || continue
      ok=0
      for a in ${allowed[$layer]}; do [ "$target" = "$a" ] && ok=1; done
      if [ $ok -eq 0 ]; then
        echo "${f#"$root"/}:$line: $layer/ may not include $target/ ($layer/ builds on ${allowed[$layer]// /, } only)"
        bad=$((bad + 1))
      fi
    done < <(grep -n -o '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]*/' "$f" |
             sed -E 's/^([0-9]+):.*"([a-z_]*)\/$/\1:\2/')
    case $layer in io | pipeline) ;; *) continue ;; esac
    rel=${f#"$root"/}
    from=$(floor_dir "$rel")
    while IFS=: read -r line target; do
      [ -n "$target" ] || continue
      to=$(floor_dir "$target")
      [ "$to" = "$from" ] && continue
      if [ -z "${floor[$from]:-}" ] || [ -z "${floor[$to]:-}" ]; then
        unknown=$to
        [ -n "${floor[$from]:-}" ] || unknown=$from
        echo "$rel:$line: $unknown/ is no floor of $layer/ (add it to check_layers.sh's floors: $(floors_of "$layer"))"
        bad=$((bad + 1))
      elif [ "${floor[$to]}" -ge "${floor[$from]}" ]; then
        echo "$rel:$line: $from/ may not include $to/ (floors of $layer/, lowest first: $(floors_of "$layer"))"
        bad=$((bad + 1))
      fi
    done < <(grep -n -o "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$layer/[a-z_/]*\.h\"" "$f" |
             sed -E 's/^([0-9]+):.*"([a-z_/]*\.h)"$/\1:\2/')
  done < <(find "$root/$layer" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print0)
done
while IFS= read -r -d '' f; do
  rel=${f#"$root"/}
  while IFS=: read -r line target; do
    home=${target%/*}
    case "$rel" in "$home"/*) continue ;; esac
    echo "$rel:$line: $target is private to $home/ (include a public header of it)"
    bad=$((bad + 1))
  done < <(grep -n -o '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_/]*_internal\.h"' "$f" |
           sed -E 's/^([0-9]+):.*"([a-z_/]*_internal\.h)"$/\1:\2/')
done < <(find "$root" \( -name 'build*' -o -name '.git' \) -prune -o -type f \
           \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cc' -o -name '*.cpp' \) -print0)
if [ $bad -gt 0 ]; then
  echo "check_layers: $bad include(s) break the layering (DESIGN.md, Layout)"
  exit 1
fi
echo "check_layers: $checked files, layering kept"
