#!/usr/bin/env bash
# The one-GPU rehearsal on the `device` machine, over one or more calls (each at most 10 minutes).
# First, here: `python benchmarks/device_wheels.py` makes .whl/ (MLflow and what it needs that the
# device's image lacks, at constraints.txt's versions); name .whl in the call's carry. Then:
#   GRADSHARE_COMMIT=<this checkout's commit, written out> bash benchmarks/rehearsal_device.sh start
#       # (written out here: `$(git describe)` runs on the device, whose copy of git can be stale)
#       # install MLflow's wheels (.whl), copy this tree aside (later calls may change it), then in a
#       # session of its own: the harness's single on the study's documents (benchmarks/gpu_path.py,
#       # as many updates as the rehearsal, where that is 6 or more), then the whole rehearsal beside
#       # it; wait up to LIMIT_S, or until the rehearsal ends
#   bash benchmarks/rehearsal_device.sh wait    # the next call, on the same warm machine: wait again
# REHEARSAL_ARGS passes options on to benchmarks/rehearsal.py: "--updates 4" is the short GPU
# check (about 5 minutes on an H200); none runs the plan's own 128 updates on the full data.
# Each call copies what exists by then to $OUT: log.txt, gpu_path.json, rehearsal.json/.md,
# store.tar.gz, the profiles of the production single and of the harness's, done.
set -u
W=/tmp/rehearsal
SRC=/tmp/rehearsal-src
LIMIT_S=${LIMIT_S:-560}
export PYTHONPATH=/tmp/site:$SRC
if [ "${1:-}" = start ]; then
  ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/ here: make it with python benchmarks/device_wheels.py and carry .whl"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf $W $SRC && mkdir -p $W/harness && cp -r . $SRC && rm -rf $SRC/.whl
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $W/log
  updates=$(python3 - ${REHEARSAL_ARGS:-} <<'PY'
import sys
args = sys.argv[1:]
print(args[args.index("--updates") + 1] if "--updates" in args else 128)
PY
)
  # the harness's single needs 6 updates or more (benchmarks/gpu_path.py): a shorter rehearsal runs without it
  harness=""
  if [ "$updates" -ge 6 ]; then
    harness="python3 benchmarks/gpu_path.py --only single --updates $updates --skip-calibrate --out $W/harness/gpu_path.json \
      --workdir /tmp/gradshare-gpu-path;"
  fi
  cd $SRC && GRADSHARE_COMMIT=${GRADSHARE_COMMIT:-unknown} setsid nohup bash -c "
    $harness
    python3 benchmarks/rehearsal.py --work $W \$( [ -e $W/harness/gpu_path.json ] && echo --harness $W/harness/gpu_path.json ) \
      --profile-update $((updates - 1)) ${REHEARSAL_ARGS:-}; echo \$? > $W/exit" >> $W/log 2>&1 < /dev/null &
  cd - > /dev/null
fi
end=$((SECONDS + LIMIT_S))
# the log goes to $OUT as it grows: a call cut short by the device's own limit (less device time
# left than LIMIT_S) still brings back how far the rehearsal got
# it ends early when the rehearsal ends, done or not ($W/exit: a rehearsal that died at its start
# must not hold the device for the rest of LIMIT_S)
while [ ! -e $W/out/done ] && [ ! -e $W/exit ] && [ $SECONDS -lt $end ]; do sleep 5; tail -c 4000000 $W/log > $OUT/log.txt; done
tail -c 4000000 $W/log > $OUT/log.txt
cp $W/harness/gpu_path.json $OUT/ 2>/dev/null
cp $W/harness/profile_single.txt $OUT/profile_harness.txt 2>/dev/null
for f in rehearsal.json rehearsal.md store.tar.gz profile_single.txt done; do [ -e $W/out/$f ] && cp $W/out/$f $OUT/; done
grep -E '^\[rehearsal\]|^single |s/update' $W/log | tail -20
if [ -e $W/out/done ]; then cat $W/out/rehearsal.md
elif [ -e $W/exit ]; then echo "the rehearsal ended without its table (exit $(cat $W/exit))"; tail -20 $W/log
else echo "still running"; tail -5 $W/log; fi
