#!/usr/bin/env bash
# Run a command as if on a slower machine: on one CPU (taskset), at PERCENT of that CPU's
# time (a cgroup's CPU quota), so that PyTorch uses one thread and a run's speed is a known
# share of this machine's. Needs root and the cgroup file system (v1 or v2).
#
#   bash scripts/slower_machine.sh CPU PERCENT COMMAND...
#   bash scripts/slower_machine.sh 0 65 python -m annotated_transformer train --task translation ...
#
# The book's Performance page ("Fitting the model to the machine") limits a 2-core machine
# so: one CPU at 65% is about 40% of both at full speed.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bash scripts/slower_machine.sh CPU PERCENT COMMAND..." >&2
  exit 2
fi
cpu=$1 percent=$2
shift 2
case $percent in
  ''|*[!0-9]*) echo "PERCENT must be a whole number from 1 to 100, got '$percent'" >&2; exit 2 ;;
esac
if [ "$percent" -lt 1 ] || [ "$percent" -gt 100 ]; then
  echo "PERCENT must be a whole number from 1 to 100, got '$percent'" >&2
  exit 2
fi
period=100000 quota=$((percent * 1000))
if [ -d /sys/fs/cgroup/cpu ]; then  # cgroup v1
  root=/sys/fs/cgroup/cpu tasks=tasks
  group=$root/slower-machine-$$
  mkdir "$group"
  echo $period > "$group/cpu.cfs_period_us"
  echo $quota > "$group/cpu.cfs_quota_us"
else  # cgroup v2
  root=/sys/fs/cgroup tasks=cgroup.procs
  group=$root/slower-machine-$$
  mkdir "$group"
  echo "$quota $period" > "$group/cpu.max"
fi
leave() { echo $$ > "$root/$tasks"; rmdir "$group"; }
trap leave EXIT
echo $$ > "$group/$tasks"
taskset -c "$cpu" "$@"
