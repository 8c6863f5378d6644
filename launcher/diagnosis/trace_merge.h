#pragma once
// The ranks' timelines of one round (the trainer's --trace-steps), merged into one Chrome trace.
// ddprun points the workers' DDP_TRACE_DIR at the round's folder; after a round that succeeded
// each agent publishes its workers' trace-rank<R>.json through the store, and node 0's agent,
// after the exit barrier (when every node has published), merges every rank's into one file with
// a track per rank that Perfetto and chrome://tracing open.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp {
class Store;
}

namespace ddprun {

// (rank, the file's text) of every trace-rank<R>.json in `dir`; none for a missing folder. A file
// above 16 MiB is left out, with a warning.
std::vector<std::pair<int, std::string>> read_local_traces(const std::string& dir);

// One trace of every event of `traces` (each a Chrome trace JSON object). Throws ddp::Error naming
// the rank of a file that is not one.
std::string merge_traces(const std::vector<std::pair<int, std::string>>& traces);

// Publishes this node's traces in `store` (the round's "trace" view).
void publish_traces(ddp::Store& store, const std::vector<std::pair<int, std::string>>& traces);

// Node 0, after the exit barrier: merges every published rank's trace into `path`. Returns the
// number of ranks merged (0: nobody traced; nothing written).
int merge_published_traces(ddp::Store& store, int world_size, const std::string& path);

}  // namespace ddprun
