#!/bin/bash
# usage: rep.sh BIN WF OUT DELAY
BIN=$1; WF=$2; OUT=$3; D=$4
rm -rf $OUT
$BIN run $WF -q > /tmp/stopcrash/log.$$ 2>&1 &
pid=$!
sleep $D
kill -TERM $pid
wait $pid
rc=$?
echo "delay $D rc $rc $(tail -c 300 /tmp/stopcrash/log.$$ | tr '\n' ' ')"
