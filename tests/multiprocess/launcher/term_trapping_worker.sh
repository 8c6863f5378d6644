#!/bin/sh
# A worker that ignores SIGTERM (it only reports it) and leaves a grandchild running, to test
# that ddprun escalates to SIGKILL after --shutdown-timeout and leaves no process behind.
sleep 300 &
echo "grandchild_pid=$! rank=$RANK"
trap 'echo "rank $RANK got SIGTERM"' TERM
echo "shell_pid=$$ rank=$RANK"
while true; do sleep 0.05; done
