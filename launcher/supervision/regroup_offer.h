#pragma once
// In-process regrouping, the agent's side of the files it shares with each worker (the worker's
// side: ddp/distributed.h, ProcessGroup::regroup; the notice: comm/abort_notice.h).
//
// For a membership change of an elastic job (a node lost, or nodes waiting to join) whose
// workers all offer to regroup (<DDP_REGROUP_FILE>.able, written by a Trainer built on the
// library's process group), the round's supervisor does not stop them:
// 1. it writes a regroup notice into each worker's DDP_ABORT_FILE: "regroup: <cause>" for a lost
//    node or store host (the step in flight is given up), "regroup after step: <cause>" for a join (every
//    rank stops after the same step), "regroup when stopped: <cause>" for a node that leaves on
//    a signal (its ranks' stop vote stops every rank after the same step and a checkpoint; the
//    others then regroup);
// 2. each worker keeps its state in memory and answers in <DDP_REGROUP_FILE>.ready; once all
//    have, the round ends with its workers running (RoundOutcome::kRegrouped), and the agents
//    agree on the next round as for any change;
// 3. the agent removes the notice and writes each worker's place in the new round into
//    DDP_REGROUP_FILE (write_place): the worker joins the new world in the same process.
// A worker that does not offer (a Python program) or does not answer within
// kRegroupAnswerWithin makes the node fall back to today's path: stop, next round, restart.
#include <chrono>
#include <string>

#include "config/launch_config.h"
#include "diagnosis/failure_report.h"

namespace ddprun {

constexpr auto kRegroupAnswerWithin = std::chrono::seconds(10);

// Whether `cause` may be met by regrouping in-process: a node lost, a node that leaves on a
// signal, nodes waiting to join, or the store's host lost (kind "store": the store moves).
bool regroups_for(const FailureReport& cause);

// The notice's text for `cause` (see the file comment).
std::string regroup_notice(const FailureReport& cause);

// The worker of `regroup_file` offers to regroup / has answered the notice.
bool offers_regroup(const std::string& regroup_file);
bool answered_regroup(const std::string& regroup_file);

// Writes the worker's place, the torchrun variables of `env` that differ from round to round
// (RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT, ...), one NAME=VALUE a line, into
// `regroup_file` at once (a rename).
void write_place(const std::string& regroup_file, const EnvMap& env);

// What a worker whose collective failed on its own waits for the notice (DDP_REGROUP_WAIT_SEC):
// the heartbeat limit, two beat intervals and 5 s, in whole seconds.
long regroup_wait_seconds(const RendezvousSettings& rdzv);

}  // namespace ddprun
