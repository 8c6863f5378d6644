#!/bin/sh
# Answers SIGTERM like a trainer that saves a checkpoint first: exits with 75 (EX_TEMPFAIL,
# "rerunning resumes"), the code a podFailurePolicy can ignore.
trap 'echo "rank $RANK checkpointed"; exit 75' TERM
echo "ready rank=$RANK"
while true; do sleep 0.05; done
