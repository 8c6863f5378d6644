#include "hang_diagnosis.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ddp/error.h"

namespace ddprun {
namespace {

using json = nlohmann::json;

constexpr std::size_t kCulpritsShown = 5;
constexpr std::size_t kWaitEdgesShown = 8;

json op_json(const std::optional<HangOp>& op) {
  if (!op) return nullptr;
  return {{"seq", op->seq},
          {"kind", op->kind},
          {"description", op->description},
          {"seconds", op->seconds},
          {"waiting_on", op->waiting_on}};
}

std::optional<HangOp> op_from(const json& j) {
  if (j.is_null()) return std::nullopt;
  HangOp op;
  op.seq = j.at("seq").get<unsigned long long>();
  op.kind = j.at("kind").get<std::string>();
  op.description = j.at("description").get<std::string>();
  op.seconds = j.at("seconds").get<double>();
  op.waiting_on = j.at("waiting_on").get<int>();
  return op;
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", s);
  return text;
}

struct Seen {
  const WorkerHangState* worker;
  const NodeHangReport* node;
};

std::string where(const Seen& s) {
  return "rank " + std::to_string(s.worker->rank) + " (node " + std::to_string(s.node->node) +
         ", " + s.node->host + ")";
}

std::string indented(const std::string& text, const std::string& indent) {
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += indent + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string NodeHangReport::to_json() const {
  json workers_json = json::array();
  for (const auto& w : workers) {
    workers_json.push_back({{"rank", w.rank},
                            {"local_rank", w.local_rank},
                            {"pid", w.pid},
                            {"process_state", w.process_state},
                            {"has_recorder", w.has_recorder},
                            {"recorder_note", w.recorder_note},
                            {"running", op_json(w.running)},
                            {"last_finished", op_json(w.last_finished)},
                            {"stack", w.stack}});
  }
  return json{{"node", node}, {"host", host}, {"workers", workers_json}}.dump();
}

NodeHangReport NodeHangReport::from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    NodeHangReport r;
    r.node = j.at("node").get<int>();
    r.host = j.at("host").get<std::string>();
    for (const auto& w : j.at("workers")) {
      WorkerHangState s;
      s.rank = w.at("rank").get<int>();
      s.local_rank = w.at("local_rank").get<int>();
      s.pid = w.at("pid").get<int>();
      s.process_state = w.at("process_state").get<std::string>();
      s.has_recorder = w.at("has_recorder").get<bool>();
      s.recorder_note = w.at("recorder_note").get<std::string>();
      s.running = op_from(w.at("running"));
      s.last_finished = op_from(w.at("last_finished"));
      s.stack = w.at("stack").get<std::string>();
      r.workers.push_back(std::move(s));
    }
    return r;
  } catch (const json::exception& e) {
    throw ddp::Error(std::string("malformed hang report from another node's agent: ") + e.what());
  }
}

bool locally_suspect(const WorkerHangState& worker, double threshold_seconds) {
  if (worker.process_state.rfind("stopped", 0) == 0) return true;
  if (!worker.has_recorder) return false;
  return !worker.running || worker.running->seconds < threshold_seconds;
}

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::optional<HangDiagnosis> diagnose_hang(const std::vector<NodeHangReport>& reports, int nodes) {
  std::vector<Seen> all;
  std::set<int> reported_nodes;
  for (const auto& r : reports) {
    reported_nodes.insert(r.node);
    for (const auto& w : r.workers) all.push_back({&w, &r});
  }
  unsigned long long newest = 0;
  for (const auto& s : all) {
    if (s.worker->running) newest = std::max(newest, s.worker->running->seq);
  }
  if (newest == 0) return std::nullopt;

  std::vector<int> waiting;
  std::vector<int> unknown;
  std::vector<Seen> culprits;
  const HangOp* op = nullptr;  // the op the others wait in, as the longest waiter sees it
  double waited = 0;
  std::vector<std::pair<int, int>> edges;  // waiter -> the peer it waits on
  for (const auto& s : all) {
    const auto& w = *s.worker;
    if (w.running && w.running->seq == newest) {
      waiting.push_back(w.rank);
      if (op == nullptr || w.running->seconds > waited) {
        op = &*w.running;
        waited = w.running->seconds;
      }
      if (w.running->waiting_on >= 0) edges.emplace_back(w.rank, w.running->waiting_on);
    } else if (!w.has_recorder) {
      unknown.push_back(w.rank);
    } else {
      culprits.push_back(s);
    }
  }
  std::sort(culprits.begin(), culprits.end(),
            [](const Seen& a, const Seen& b) { return a.worker->rank < b.worker->rank; });
  std::vector<int> missing_nodes;
  for (int n = 0; n < nodes; ++n) {
    if (reported_nodes.count(n) == 0) missing_nodes.push_back(n);
  }

  HangDiagnosis d;
  const auto ranks = [](const std::vector<int>& r) {
    return (r.size() > 1 ? "ranks " : "rank ") + rank_ranges(r);
  };
  const auto verb = [](const std::vector<int>& r, const char* one, const char* many) {
    return std::string(r.size() > 1 ? many : one);
  };
  const std::string waiters =
      ranks(waiting) + verb(waiting, " waits", " wait") + " in it for " + seconds_text(waited);
  if (!culprits.empty()) {
    for (const auto& c : culprits) d.culprits.push_back(c.worker->rank);
    d.headline = where(culprits.front()) + " has not entered " + op->description + "; " + waiters;
    if (culprits.size() > 1) {
      std::vector<int> others(d.culprits.begin() + 1, d.culprits.end());
      d.headline += "; nor " + verb(others, "has ", "have ") + ranks(others);
    }
  } else if (!missing_nodes.empty()) {
    d.headline = ranks(waiting) + verb(waiting, " waits", " wait") + " in " + op->description +
                 " for " + seconds_text(waited) + "; " + verb(missing_nodes, "node ", "nodes ") +
                 rank_ranges(missing_nodes) +
                 " sent no report: an agent gone or cut off, whose ranks are the likely cause";
  } else if (!unknown.empty()) {
    d.headline = ranks(waiting) + verb(waiting, " waits", " wait") + " in " + op->description +
                 " for " + seconds_text(waited) + "; " + ranks(unknown) +
                 verb(unknown, " keeps", " keep") +
                 " no flight recorder (not built on ddp), the likely cause";
    d.culprits = unknown;
  } else {
    d.headline = "every rank waits in " + op->description + " for " + seconds_text(waited) +
                 ": none is missing from it, so a link or a peer's transport is stuck";
  }

  std::string text = "hang: " + d.headline + "\n";
  for (std::size_t i = 0; i < culprits.size() && i < kCulpritsShown; ++i) {
    const auto& w = *culprits[i].worker;
    text +=
        "  " + where(culprits[i]) + ", pid " + std::to_string(w.pid) + ", is " + w.process_state;
    if (w.running) {
      text +=
          "; it waits in " + w.running->description + " for " + seconds_text(w.running->seconds);
    }
    if (w.last_finished) {
      text += "; it last finished " + w.last_finished->description + " " +
              seconds_text(w.last_finished->seconds) + " ago";
    } else {
      text += "; it has finished no collective";
    }
    text += "\n";
    if (!w.stack.empty()) {
      text += "  its stack:\n" + indented(w.stack, "    ");
    } else if (!w.recorder_note.empty()) {
      text += "  " + w.recorder_note + "\n";
    }
  }
  if (culprits.size() > kCulpritsShown) {
    text += "  (" + std::to_string(culprits.size() - kCulpritsShown) + " more not shown)\n";
  }
  if (!edges.empty()) {
    std::sort(edges.begin(), edges.end());
    text += "  waiting on:";
    for (std::size_t i = 0; i < edges.size() && i < kWaitEdgesShown; ++i) {
      text += (i ? ", " : " ") + std::to_string(edges[i].first) + "->" +
              std::to_string(edges[i].second);
    }
    if (edges.size() > kWaitEdgesShown) text += ", ...";
    text += "\n";
  }
  d.text = text;
  return d;
}

}  // namespace ddprun
