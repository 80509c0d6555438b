#!/usr/bin/env bash
# Inside the Soft-RoCE VM: rdma-check's passive pair (status_byte, 64 KiB x 2,000 messages, 3 blocks, rc) run N times;
# a pair still running after 90 s is a stall: both processes' backtraces (gdb), the rxe0 port counters and the
# sender's stderr and the queue pairs (`rdma resource show qp`) go to $OUT_DIR. Seen in a full-suite run on a loaded
# host (1,117 of 2,000 delivered, then nothing for 300 s), then in this loop on a loaded host (load 9-15): 3 stalls in
# 28 runs of main, 1 in 20 with an attempted fix, 1 in 12 with UCX_RC_FENCE_MODE=none, each with the sender waiting
# for its status read (docs/rdma.md, "A stall in Soft-RoCE"); none in 15 runs at load ~4. Usage:
#   OUT_DIR=/tmp/passive bash scripts/softroce-vm.sh 'N=10 bash tests/rdma/passive_loop.sh'
set -u
N=${N:-6}
OUT_DIR=${OUT_DIR:-$PWD/softroce-out}
mkdir -p "$OUT_DIR"
stalls=0
for i in $(seq "$N"); do
  build/slotstream bench-peer recv --listen 127.0.0.1:0 --transport rdma --rdma-transport rc >"/tmp/rx$i.out" 2>&1 &
  rx=$!
  for _ in $(seq 40); do grep -q '^listening on' "/tmp/rx$i.out" 2>/dev/null && break; sleep 0.25; done
  to=$(sed -n 's/^listening on //p' "/tmp/rx$i.out")
  start=$SECONDS
  build/slotstream bench-peer send --to "$to" --transport rdma --rdma-transport rc --protocol status_byte \
    --size 65536 --count 2000 --blocks 3 >"/tmp/tx$i.out" 2>"$OUT_DIR/tx$i.err" &
  tx=$!
  while kill -0 "$tx" 2>/dev/null && ((SECONDS - start < 90)); do sleep 1; done
  if kill -0 "$tx" 2>/dev/null; then
    stalls=$((stalls + 1))
    echo "passive loop: run $i STALLED after $((SECONDS - start)) s"
    # The queue pairs and counters first: gdb stops each process for minutes under emulation, after which the sender
    # gives the stopped receiver up (its stall timeout, 30 s) and both close their queue pairs.
    for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do echo "$(basename "$f") $(cat "$f")"; done >"$OUT_DIR/hw$i.txt"
    rdma -d resource show qp >"$OUT_DIR/qp$i.txt" 2>&1
    gdb -p "$tx" -batch -ex "thread apply all bt" >"$OUT_DIR/tx$i.bt" 2>&1
    gdb -p "$rx" -batch -ex "thread apply all bt" >"$OUT_DIR/rx$i.bt" 2>&1
    kill -9 "$tx"
  fi
  wait "$tx"
  echo "passive loop: run $i: exit $? in $((SECONDS - start)) s; receiver: $(grep -o '"messages":[0-9]*' "/tmp/rx$i.out" | head -1)"
  kill "$rx" 2>/dev/null
  wait "$rx" 2>/dev/null
done
echo "passive loop: $stalls stall(s) in $N runs"
exit $((stalls > 0))
