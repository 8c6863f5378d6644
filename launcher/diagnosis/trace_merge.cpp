#include "diagnosis/trace_merge.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/store.h"

namespace ddprun {
namespace {

using json = nlohmann::json;
constexpr std::uintmax_t kMaxTraceBytes = 16U << 20;

}  // namespace

std::vector<std::pair<int, std::string>> read_local_traces(const std::string& dir) {
  std::vector<std::pair<int, std::string>> traces;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return traces;
  const std::regex name("trace-rank([0-9]+)\\.json");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || !std::regex_match(file, m, name)) continue;
    if (entry.file_size(ec) > kMaxTraceBytes) {
      ddp::log::warn("{} is larger than 16 MiB; left out of the merged trace (trace fewer steps)",
                     entry.path().string());
      continue;
    }
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    traces.emplace_back(std::stoi(m[1]), text.str());
  }
  std::sort(traces.begin(), traces.end());
  return traces;
}

std::string merge_traces(const std::vector<std::pair<int, std::string>>& traces) {
  json events = json::array();
  for (const auto& [rank, text] : traces) {
    const json doc = json::parse(text, nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents") ||
        !doc["traceEvents"].is_array()) {
      throw ddp::Error("rank " + std::to_string(rank) +
                       "'s trace is not a Chrome trace (no traceEvents array)");
    }
    for (const auto& e : doc["traceEvents"]) events.push_back(e);
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void publish_traces(ddp::Store& store, const std::vector<std::pair<int, std::string>>& traces) {
  for (const auto& [rank, text] : traces) store.set("rank/" + std::to_string(rank), text);
  store.add("ranks", static_cast<int64_t>(traces.size()));
}

int merge_published_traces(ddp::Store& store, int world_size, const std::string& path) {
  if (store.add("ranks", 0) == 0) return 0;
  std::vector<std::pair<int, std::string>> traces;
  for (int r = 0; r < world_size; ++r) {
    const std::string key = "rank/" + std::to_string(r);
    if (store.check({key})) traces.emplace_back(r, store.get(key));
  }
  std::ofstream out(path, std::ios::trunc);
  out << merge_traces(traces) << "\n";
  out.close();
  if (!out) throw ddp::Error("cannot write the merged trace " + path);
  return static_cast<int>(traces.size());
}

}  // namespace ddprun
