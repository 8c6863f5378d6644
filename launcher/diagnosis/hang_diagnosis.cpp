#include "diagnosis/hang_diagnosis.h"

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
                            {"stack", w.stack},
                            {"c10d_wait", w.c10d_wait},
                            {"idle_seconds", w.idle_seconds}});
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
      s.c10d_wait = w.at("c10d_wait").get<std::string>();
      s.idle_seconds = w.at("idle_seconds").get<double>();
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

std::string c10d_wait_of(const std::string& stack, int pid) {
  const std::string eu_header = "TID " + std::to_string(pid) + ":";
  const std::string gdb_header = "(LWP " + std::to_string(pid) + ")";
  bool in_main = false;
  bool seen = false;
  std::string verdict = "none";
  std::size_t start = 0;
  while (start < stack.size()) {
    std::size_t end = stack.find('\n', start);
    if (end == std::string::npos) end = stack.size();
    const std::string line = stack.substr(start, end - start);
    start = end + 1;
    if (line.rfind("TID ", 0) == 0 || line.rfind("Thread ", 0) == 0) {
      in_main = line.rfind(eu_header, 0) == 0 || line.find(gdb_header) != std::string::npos;
      seen = seen || in_main;
      continue;
    }
    if (!in_main || line.find("c10d::") == std::string::npos) continue;
    if (line.find("Store") != std::string::npos) return "store";
    if (line.find("wait") != std::string::npos || line.find("Wait") != std::string::npos ||
        line.find("arrier") != std::string::npos) {
      verdict = "collective";
    }
  }
  return seen ? verdict : "";
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

namespace {

bool waits_in_c10d(const WorkerHangState& w) {
  return !w.has_recorder && (w.c10d_wait == "collective" || w.c10d_wait == "store");
}

// The ranks of a hang, sorted by what they do: wait in the op, are absent from it, or cannot be
// read.
struct HangPicture {
  std::vector<int> waiting;
  std::vector<int> unknown;  // no recorder and no readable stack
  std::vector<Seen> culprits;
  std::vector<int> missing_nodes;  // nodes that sent no report
  const HangOp* op = nullptr;      // the op the others wait in, as the longest waiter sees it
  double waited = 0;               // how long the longest waiter waits
  std::string op_text;             // the op, in words
  std::vector<std::pair<int, int>> edges;  // waiter -> the peer it waits on
};

// The newest op any rank waits in (0: none), and whether any c10d worker waits in torch.
std::pair<unsigned long long, bool> newest_wait(const std::vector<Seen>& all) {
  unsigned long long newest = 0;
  bool any_c10d_wait = false;
  for (const auto& s : all) {
    if (s.worker->running) newest = std::max(newest, s.worker->running->seq);
    any_c10d_wait = any_c10d_wait || waits_in_c10d(*s.worker);
  }
  return {newest, any_c10d_wait};
}

std::optional<HangPicture> picture_of(const std::vector<NodeHangReport>& reports, int nodes) {
  std::vector<Seen> all;
  std::set<int> reported_nodes;
  for (const auto& r : reports) {
    reported_nodes.insert(r.node);
    for (const auto& w : r.workers) all.push_back({&w, &r});
  }
  const auto [newest, any_c10d_wait] = newest_wait(all);
  if (newest == 0 && !any_c10d_wait) return std::nullopt;
  HangPicture p;
  double c10d_waited = 0;
  bool all_c10d_in_store = true;
  for (const auto& s : all) {
    const auto& w = *s.worker;
    if (newest != 0 && w.running && w.running->seq == newest) {
      p.waiting.push_back(w.rank);
      if (p.op == nullptr || w.running->seconds > p.waited) {
        p.op = &*w.running;
        p.waited = w.running->seconds;
      }
      if (w.running->waiting_on >= 0) p.edges.emplace_back(w.rank, w.running->waiting_on);
    } else if (waits_in_c10d(w)) {
      p.waiting.push_back(w.rank);
      c10d_waited = std::max(c10d_waited, w.idle_seconds);
      all_c10d_in_store = all_c10d_in_store && w.c10d_wait == "store";
    } else if (!w.has_recorder && w.c10d_wait != "none" &&
               w.process_state.rfind("stopped", 0) != 0) {
      p.unknown.push_back(w.rank);
    } else {
      p.culprits.push_back(s);
    }
  }
  std::sort(p.waiting.begin(), p.waiting.end());
  std::sort(p.culprits.begin(), p.culprits.end(),
            [](const Seen& a, const Seen& b) { return a.worker->rank < b.worker->rank; });
  for (int n = 0; n < nodes; ++n) {
    if (reported_nodes.count(n) == 0) p.missing_nodes.push_back(n);
  }
  // Python workers name no op: where their stacks are is what is known.
  p.op_text = p.op != nullptr ? p.op->description
              : all_c10d_in_store
                  ? "the rendezvous store (init_process_group or a store-based barrier)"
                  : "a torch.distributed collective";
  if (p.op == nullptr) p.waited = c10d_waited;
  return p;
}

std::string ranks_text(const std::vector<int>& r) {
  return (r.size() > 1 ? "ranks " : "rank ") + rank_ranges(r);
}

std::string verb(const std::vector<int>& r, const char* one, const char* many) {
  return std::string(r.size() > 1 ? many : one);
}

// The diagnosis's one line, and its culprits.
void headline(const HangPicture& p, HangDiagnosis& d) {
  const std::string waits_in = ranks_text(p.waiting) + verb(p.waiting, " waits", " wait");
  if (!p.culprits.empty()) {
    for (const auto& c : p.culprits) d.culprits.push_back(c.worker->rank);
    d.headline = where(p.culprits.front()) + " has not entered " + p.op_text + "; " + waits_in +
                 " in it for " + seconds_text(p.waited);
    if (p.culprits.size() > 1) {
      std::vector<int> others(d.culprits.begin() + 1, d.culprits.end());
      d.headline += "; nor " + verb(others, "has ", "have ") + ranks_text(others);
    }
  } else if (!p.missing_nodes.empty()) {
    d.headline = waits_in + " in " + p.op_text + " for " + seconds_text(p.waited) + "; " +
                 verb(p.missing_nodes, "node ", "nodes ") + rank_ranges(p.missing_nodes) +
                 " sent no report: an agent gone or cut off, whose ranks are the likely cause";
  } else if (!p.unknown.empty()) {
    d.headline = waits_in + " in " + p.op_text + " for " + seconds_text(p.waited) + "; " +
                 ranks_text(p.unknown) + verb(p.unknown, " keeps", " keep") +
                 " no flight recorder and could not be read (no stack), the likely cause";
    d.culprits = p.unknown;
  } else {
    d.headline = "every rank waits in " + p.op_text + " for " + seconds_text(p.waited) +
                 ": none is missing from it, so " +
                 (p.op != nullptr ? "a link or a peer's transport is stuck"
                                  : "they wait in different collectives, or a link or a peer's "
                                    "transport is stuck");
  }
}

// What one culprit was doing, with its stack.
std::string culprit_paragraph(const Seen& culprit, const std::string& python_stack_signal) {
  const auto& w = *culprit.worker;
  std::string text =
      "  " + where(culprit) + ", pid " + std::to_string(w.pid) + ", is " + w.process_state;
  if (!w.has_recorder) {
    text += "; its main thread has neither run nor woken up for " + seconds_text(w.idle_seconds) +
            ", in no torch.distributed call";
  } else {
    if (w.running) {
      text +=
          "; it waits in " + w.running->description + " for " + seconds_text(w.running->seconds);
    }
    text += w.last_finished ? "; it last finished " + w.last_finished->description + " " +
                                  seconds_text(w.last_finished->seconds) + " ago"
                            : "; it has finished no collective";
  }
  text += "\n";
  if (!w.stack.empty()) {
    text += "  its stack:\n" + indented(w.stack, "    ");
  } else if (!w.recorder_note.empty() && w.has_recorder) {
    text += "  " + w.recorder_note + "\n";
  }
  if (!w.has_recorder) {
    text += python_stack_signal.empty()
                ? "  for its Python stack, register faulthandler on a signal and set "
                  "DDP_PY_STACK_SIGNAL (launcher/README.md, Hang diagnosis)\n"
                : "  its Python stack follows in its output, where the script registered "
                  "faulthandler on " +
                      python_stack_signal + "\n";
  }
  return text;
}

// "  waiting on: 0->1, 1->2\n", or "" when no rank names the peer it waits on.
std::string wait_edges(std::vector<std::pair<int, int>> edges) {
  if (edges.empty()) return "";
  std::sort(edges.begin(), edges.end());
  std::string text = "  waiting on:";
  for (std::size_t i = 0; i < edges.size() && i < kWaitEdgesShown; ++i) {
    text +=
        (i ? ", " : " ") + std::to_string(edges[i].first) + "->" + std::to_string(edges[i].second);
  }
  if (edges.size() > kWaitEdgesShown) text += ", ...";
  return text + "\n";
}

}  // namespace

std::optional<HangDiagnosis> diagnose_hang(const std::vector<NodeHangReport>& reports, int nodes,
                                           const std::string& python_stack_signal) {
  const auto picture = picture_of(reports, nodes);
  if (!picture) return std::nullopt;
  HangDiagnosis d;
  headline(*picture, d);
  d.text = "hang: " + d.headline + "\n";
  const auto& culprits = picture->culprits;
  for (std::size_t i = 0; i < culprits.size() && i < kCulpritsShown; ++i) {
    d.text += culprit_paragraph(culprits[i], python_stack_signal);
  }
  if (culprits.size() > kCulpritsShown) {
    d.text += "  (" + std::to_string(culprits.size() - kCulpritsShown) + " more not shown)\n";
  }
  d.text += wait_edges(picture->edges);
  return d;
}

}  // namespace ddprun
