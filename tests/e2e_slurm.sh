#!/usr/bin/env bash
# `tilewise submit` on a real SLURM: a 4-task job array plus its merge job,
# run by a local slurmctld + slurmd (scripts/slurm_local.sh), give the same
# class and probability rasters as one plain `tilewise run`.
#
# The workflow and the output directory have a space, a quote and a $ in
# their names, so the quoting of the generated scripts is exercised by bash
# and by SLURM itself. Each task must have run its own shard (one
# run.shardI-of-0004.json per task) and logged to <out>/.tilewise-slurm/.
#
# Then SLURM's time-limit warning for real: USR1 to task 0's batch shell makes
# tilewise commit and exit 75, the task requeues itself and resumes; the
# merged result still equals a single run.
#
# Then an array submitted with another configuration over committed parts:
# every task refuses (exit 6), nothing is deleted, no merge runs; the array
# with the original configuration resumes and merges equal to a single run.
#
# Skipped (77) where a local SLURM cannot start: not root, slurm-wlm cannot
# be installed, or a daemon fails. The daemons are stopped on every exit,
# and by a watchdog should this script be killed outright.
set -uo pipefail

if [ -z "${TW_BIN:-}" ] || [ -z "${TW_FIXTURES:-}" ] || [ -z "${TW_SOURCE_DIR:-}" ]; then
  echo "TW_BIN/TW_FIXTURES/TW_SOURCE_DIR not set: skipped"
  exit 77
fi
PY=${TW_PYTHON:-/usr/bin/python3}
LOCAL="$TW_SOURCE_DIR/scripts/slurm_local.sh"
WAIT_S=180
t_start=$(date +%s)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tw_e2e_slurm.XXXXXX") || exit 1
state="$tmp/slurm"
job_ids=()

cleanup() {
  if [ -n "${SLURM_CONF:-}" ] && [ ${#job_ids[@]} -gt 0 ]; then
    scancel "${job_ids[@]}" 2>/dev/null
    for _ in $(seq 1 50); do
      [ -z "$(squeue -h -j "$(IFS=,; echo "${job_ids[*]}")" 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  bash "$LOCAL" stop "$state"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Watchdog: if this script is killed with SIGKILL (a ctest timeout), stop the
# daemons anyway. Its own session, so a kill of our process group spares it.
setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done
  [ -f "$3/slurm.conf" ] && SLURM_CONF="$3/slurm.conf" scancel --partition=tw && sleep 2
  bash "$2" stop "$3"; rm -rf "$4"' watchdog $$ "$LOCAL" "$state" "$tmp" </dev/null >/dev/null 2>&1 &

bash "$LOCAL" start "$state"
rc=$?
if [ $rc -ne 0 ]; then
  echo "skipped: a local SLURM could not be started (scripts/slurm_local.sh exit $rc)"
  exit 77
fi
export SLURM_CONF="$state/slurm.conf"
t_up=$(date +%s)

fail=0
check() { # check CONDITION_STATUS MESSAGE
  if [ "$1" -eq 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fail=1; fi
}
submit_array() { # submit_array ARGS...: `tilewise submit ARGS`; sets sub_out, array_id, merge_id
  sub_out=$("$TW_BIN" submit "$@")
  local rc=$?
  array_id=$(sed -n 's/^array job \([0-9][0-9]*\):.*/\1/p' <<<"$sub_out")
  merge_id=$(sed -n 's/^merge job \([0-9][0-9]*\):.*/\1/p' <<<"$sub_out")
  [ -n "$array_id" ] && job_ids+=("$array_id") # cancelled on exit
  [ -n "$merge_id" ] && job_ids+=("$merge_id")
  return $rc
}
wait_jobs() { # wait_jobs JOB_IDS [STATES]: until the jobs left the queue (those states), WAIT_S at most
  local deadline=$(($(date +%s) + WAIT_S))
  while [ -n "$(squeue -h -j "$1" ${2:+-t "$2"} 2>/dev/null)" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "jobs still queued after $WAIT_S s:"
      squeue
      break
    fi
    sleep 1
  done
}
task_states() { # task_states JOB_ID: its tasks counted by state and exit code, e.g. " 4 COMPLETED 0:0"
  scontrol show job -o "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]* .* ExitCode=[0-9:]*' |
    sed 's/JobState=\([A-Z_]*\) .* ExitCode=\([0-9:]*\)/\1 \2/' | sort | uniq -c | tr -s ' '
}
same_as_ref() { # same_as_ref REF_DIR OUT_DIR: class and prob rasters identical, georeferencing too
  "$PY" - "$1" "$2" <<'EOF'
import sys
import numpy as np
from osgeo import gdal
gdal.UseExceptions()
ref, out = sys.argv[1], sys.argv[2]
bad = []
for prod in ("class", "prob"):
    a = gdal.Open(f"{ref}/L7_ETMs.{prod}.tif")
    b = gdal.Open(f"{out}/L7_ETMs.{prod}.tif")
    if (a.GetGeoTransform(), a.GetProjection(), a.RasterXSize, a.RasterYSize, a.RasterCount) != \
       (b.GetGeoTransform(), b.GetProjection(), b.RasterXSize, b.RasterYSize, b.RasterCount):
        bad.append(f"{prod}: georeferencing or size differs")
    x, y = a.ReadAsArray(), b.ReadAsArray()
    if not np.array_equal(x, y):
        bad.append(f"{prod}: {int((x != y).sum())} values differ")
    print(f"     {prod}: {x.shape} {x.dtype}, {'identical' if np.array_equal(x, y) else 'DIFFERENT'}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
}

work="$tmp/work dir it's \$HOME"
mkdir -p "$work" || exit 1
cd "$work" || exit 1
write_workflow() { # FILE OUTPUT_DIR
  cat >"$1" <<EOF
input:
  path: $TW_SOURCE_DIR/sample_data/L7_ETMs.tif
model:
  weights: $TW_FIXTURES/resnet18_6b_7c.safetensors
  mean: [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
  std: [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]
tiling:
  tile: 64
  stride: 32
runtime:
  device: cpu
  memory: 1GiB
  threads: 1
output:
  dir: "$2"
  products: [class, prob]
EOF
}

# The reference: one plain run.
write_workflow ref.yaml "$tmp/ref"
"$TW_BIN" run ref.yaml -q >/dev/null
check $? "reference run"

# The array: output.dir relative (to the submit directory) and set with --set.
wf="flow 'q' \$x.yaml"
write_workflow "$wf" "unused"
out_rel="out \"1\" \$y"
submit_array "$wf" --array 4 --set "output.dir=$out_rel"
rc=$?
echo "$sub_out"
check $rc "tilewise submit exit 0"
[ -n "$array_id" ] && [ -n "$merge_id" ]
check $? "job ids printed (array '$array_id', merge '$merge_id')"
out="$work/$out_rel"
logs="$out/.tilewise-slurm"

# Bounded wait for both jobs to leave the queue.
[ ${#job_ids[@]} -eq 2 ] && wait_jobs "$array_id,$merge_id"
t_done=$(date +%s)

# Every task and the merge COMPLETED with exit 0 (records kept MinJobAge=600 s).
states=$(task_states "$array_id")
[ "$states" = " 4 COMPLETED 0:0" ]
check $? "4 array tasks COMPLETED 0:0 (got '$states')"
mstate=$(scontrol show job -o "$merge_id" 2>/dev/null | grep -o 'JobState=[A-Z_]*')
[ "$mstate" = "JobState=COMPLETED" ]
check $? "merge job COMPLETED after the array (got '$mstate')"
dep=$(grep -c "^#SBATCH --dependency=afterok:$array_id\$" "$logs/merge.sh" 2>/dev/null)
[ "$dep" = 1 ]
check $? "merge.sh waits on afterok:$array_id"

n_reports=0
for i in 1 2 3 4; do
  [ -s "$out/run.shard000$i-of-0004.json" ] && n_reports=$((n_reports + 1))
done
[ $n_reports -eq 4 ]
check $? "each task ran its own shard ($n_reports of 4 shard reports)"
n_logs=$(ls "$logs"/tilewise-"$array_id"_[0-3].err 2>/dev/null | wc -l)
[ "$n_logs" -eq 4 ]
check $? "a log per task under .tilewise-slurm ($n_logs of 4)"

same_as_ref "$tmp/ref" "$out"
check $? "4-task SLURM array + merge job == single run (class and prob rasters)"

# ---- Part 2: SLURM's time-limit warning, for real. USR1 to the batch shell of
# task 0 (what --signal=B:USR1@120 sends): tilewise commits the chunk under
# way and exits 75, the task requeues itself, the rerun resumes from the
# committed rows, and the merged result still equals a single run.
t2=$(date +%s)
write_workflow ref8.yaml "$tmp/ref8"
"$TW_BIN" run ref8.yaml -q --set tiling.stride=8 >/dev/null
check $? "reference run, stride 8"
out2="$work/out2"
submit_array "$wf" --array 2 --chunk-rows 1 --set "output.dir=out2" --set tiling.stride=8
check $? "tilewise submit (stride 8, --chunk-rows 1)"
id2=$array_id mid2=$merge_id
# Bounded waits: task 0 has committed a row...
committed=1
for _ in $(seq 1 600); do
  grep -qs '^rows ' "$out2"/.tilewise/L7_ETMs/journal.0001-of-* && { committed=0; break; }
  sleep 0.1
done
check $committed "task 0 committed its first rows"
scancel --batch --signal=USR1 "${id2}_0"
check $? "USR1 sent to the batch shell of task ${id2}_0"
# ...it was requeued. SLURM holds a requeued job 2 minutes; release it after 3 s
# (slurmd refuses a credential issued in the second the old one was revoked).
requeued=1
for _ in $(seq 1 300); do
  scontrol show job -o "${id2}_0" 2>/dev/null | grep -q 'Restarts=1' && { requeued=0; break; }
  sleep 0.2
done
check $requeued "task 0 requeued itself after USR1"
scontrol update JobId="${id2}_0" StartTime=now+3 >/dev/null 2>&1
# ...and everything finishes.
wait_jobs "$id2,$mid2"
states=$(scontrol show job -o "$id2" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort | uniq -c | tr -s ' ')
[ "$states" = " 2 JobState=COMPLETED" ]
check $? "both tasks COMPLETED after the requeue (got '$states')"
mstate=$(scontrol show job -o "$mid2" 2>/dev/null | grep -o 'JobState=[A-Z_]*')
[ "$mstate" = "JobState=COMPLETED" ]
check $? "merge job COMPLETED (got '$mstate')"
log0="$out2/.tilewise-slurm/tilewise-${id2}_0.err"
grep -q 'interrupted after committing' "$log0" && grep -q 'requeueing job' "$log0"
check $? "task 0's log: interrupted, requeued (appended across runs)"
resumed=$(grep -o '"rows_resumed": *[0-9]*' "$out2/run.shard0001-of-0002.json" 2>/dev/null | grep -o '[0-9]*$')
[ "${resumed:-0}" -gt 0 ]
check $? "the rerun resumed from committed rows (rows_resumed ${resumed:-none})"
same_as_ref "$tmp/ref8" "$out2"
check $? "USR1 + requeue + resume + merge == single run (stride 8)"
t2_done=$(date +%s)

# ---- Part 3: an array started with another configuration over committed
# parts (a task resubmitted after an edit of the workflow) refuses, exit 6,
# and destroys nothing; the merge job does not run; the array with the
# original configuration then resumes and its merge equals a single run.
out3="$work/out3"
"$TW_BIN" run "$wf" -q --shard 1/2 --set "output.dir=out3" >/dev/null
check $? "shard 1/2 run by hand (stride 32)"
sum_before=$(cat "$out3"/.tilewise/L7_ETMs/rows-*.bin | md5sum)
submit_array "$wf" --array 2 --set "output.dir=out3" --set tiling.stride=16
check $? "tilewise submit with tiling.stride=16 over stride-32 parts"
id3=$array_id mid3=$merge_id
wait_jobs "$id3" PD,R,CG # its merge job waits on afterok: it never runs
states=$(task_states "$id3")
[ "$states" = " 2 FAILED 6:0" ]
check $? "both tasks refused with exit 6 (got '$states')"
grep -qs 'tiling.stride: 16 now, 32 in the parts' "$out3"/.tilewise-slurm/tilewise-"${id3}"_0.err
check $? "task 0's log names the key that differs"
[ "$(cat "$out3"/.tilewise/L7_ETMs/rows-*.bin | md5sum)" = "$sum_before" ]
check $? "shard 1's committed chunks are byte for byte intact"
[ ! -e "$out3/L7_ETMs.class.tif" ]
check $? "no merge ran on the refused array"
scancel "$mid3" 2>/dev/null
submit_array "$wf" --array 2 --set "output.dir=out3"
check $? "tilewise submit with the original configuration"
wait_jobs "$array_id,$merge_id"
same_as_ref "$tmp/ref" "$out3"
check $? "the original configuration resumes; merge == single run"

if [ $fail -ne 0 ]; then
  for f in "$logs"/*.err "$logs"/*.out "$out2"/.tilewise-slurm/*.err; do
    [ -s "$f" ] && { echo "---- $f"; tail -n 5 "$f"; }
  done
  echo "---- slurmctld.log"
  tail -n 20 "$state/slurmctld.log" 2>/dev/null
fi
echo "slurm up in $((t_up - t_start)) s; 4-task array + merge done in $((t_done - t_up)) s;" \
  "USR1/requeue part $((t2_done - t2)) s; total $(($(date +%s) - t_start)) s"
exit $fail
