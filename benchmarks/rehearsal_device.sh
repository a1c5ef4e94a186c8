#!/usr/bin/env bash
# The one-GPU rehearsal on the `device` machine, in one or two calls (each at most 10 minutes):
#   bash benchmarks/rehearsal_device.sh start   # install MLflow's wheels (.whl), start the rehearsal
#                                               # in a session of its own, wait up to LIMIT_S
#   bash benchmarks/rehearsal_device.sh wait    # the next call, on the same warm machine: wait again
# REHEARSAL_SET="--set hardware.cuda_graphs=false" passes overrides on to benchmarks/rehearsal.py.
# Each call copies what exists by then (log, rehearsal.json/.md, store.tar.gz) to $OUT.
set -u
W=/tmp/rehearsal
LIMIT_S=${LIMIT_S:-560}
export PYTHONPATH=/tmp/site:$PWD
if [ "${1:-}" = start ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf $W && mkdir -p $W
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $W/gpu.txt
  setsid nohup python3 benchmarks/rehearsal.py --work $W ${REHEARSAL_SET:-} > $W/log 2>&1 < /dev/null &
fi
end=$((SECONDS + LIMIT_S))
while [ ! -e $W/out/done ] && [ $SECONDS -lt $end ]; do sleep 5; done
cp $W/gpu.txt $OUT/ 2>/dev/null
tail -c 4000000 $W/log > $OUT/log.txt
for f in rehearsal.json rehearsal.md store.tar.gz done; do [ -e $W/out/$f ] && cp $W/out/$f $OUT/; done
grep '^\[rehearsal\]' $W/log | tail -20
[ -e $W/out/done ] && cat $W/out/rehearsal.md || { echo "still running"; tail -5 $W/log; }
