#include "doctor/doctor_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace ddprun::doctor {
namespace {

constexpr long long kMiB = 1LL << 20;

std::string mib(long long bytes) { return fmt::format("{} MiB", bytes / kMiB); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::vector<std::string> split_provider(const std::string& provider) {
  std::vector<std::string> parts;
  std::stringstream in(provider);
  for (std::string part; std::getline(in, part, ';');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

const char* level_word(Level level) {
  return level == Level::kBad ? "BAD" : level == Level::kWarn ? "warn" : "ok";
}

std::string size_text(long long bytes) {
  if (bytes >= kMiB) return fmt::format("{} MiB", bytes / kMiB);
  return fmt::format("{} KiB", bytes / 1024);
}

// "cpus": enough usable CPUs for the ranks; "cpu": the model and its vector and bfloat16
// support, and a warning when the program asks for --bf16 on a CPU that lacks it.
void add_cpu_findings(const NodeFacts& f, const Requirements& r, std::vector<Finding>& out) {
  if (f.usable_cpus < r.nproc_per_node) {
    out.push_back({"cpus", Level::kBad,
                   fmt::format("{} usable CPUs for {} ranks per node (CPU affinity and cgroup "
                               "quota): lower --nproc-per-node or request more CPUs",
                               f.usable_cpus, r.nproc_per_node)});
  } else {
    out.push_back({"cpus", Level::kOk,
                   fmt::format("{} usable CPUs, {} ranks", f.usable_cpus, r.nproc_per_node)});
  }
  const CpuFacts& c = f.cpu;
  if (r.bf16 && !c.native_bf16) {
    out.push_back({"cpu", Level::kWarn,
                   fmt::format("the program asks for --bf16, but this CPU ({}) lacks native "
                               "bfloat16 ({}): it trains in float32 instead; use a CPU with it "
                               "(Graviton3 and later: c7g, c7gn, hpc7g, c8g; x86-64 with "
                               "avx512_bf16) or drop --bf16",
                               c.model, c.bf16_feature)});
    return;
  }
  std::string features;
  if (c.arch == "aarch64") features += c.sve ? ", SVE" : ", no SVE";
  if (c.native_bf16) features += ", " + c.bf16_feature;
  out.push_back({"cpu", Level::kOk, fmt::format("{} ({}{})", c.model, c.arch, features)});
}

// The Arm cores of AWS instances and their neighbours, by /proc/cpuinfo's "CPU part" (Arm Ltd.,
// implementer 0x41).
struct ArmPart {
  unsigned part;
  const char* name;
};
constexpr ArmPart kArmParts[] = {
    {0xd08, "Cortex-A72 (AWS Graviton1)"},
    {0xd0c, "Neoverse N1 (AWS Graviton2)"},
    {0xd40, "Neoverse V1 (AWS Graviton3)"},
    {0xd49, "Neoverse N2"},
    {0xd4f, "Neoverse V2 (AWS Graviton4)"},
    {0xd8e, "Neoverse N3"},
    {0xd84, "Neoverse V3"},
};

// The value of the first "key\t: value" line, or "".
std::string cpuinfo_value(const std::string& cpuinfo, const std::string& key) {
  std::istringstream in(cpuinfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    if (name != key) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

}  // namespace

std::string cpu_model_from_cpuinfo(const std::string& cpuinfo) {
  const std::string model = cpuinfo_value(cpuinfo, "model name");
  if (!model.empty()) return model;
  const std::string part = cpuinfo_value(cpuinfo, "CPU part");
  if (part.empty()) return "unknown";
  const std::string implementer = cpuinfo_value(cpuinfo, "CPU implementer");
  unsigned number = 0;
  try {
    number = static_cast<unsigned>(std::stoul(part, nullptr, 16));
  } catch (const std::exception&) {
    return "arm64 part " + part;
  }
  if (implementer == "0x41") {
    for (const auto& p : kArmParts) {
      if (p.part == number) return p.name;
    }
  }
  return fmt::format("arm64 implementer {} part {}", implementer.empty() ? "?" : implementer, part);
}

long long default_shm_min_bytes(int nproc_per_node) {
  return std::max(256 * kMiB, 64 * kMiB * nproc_per_node);
}

std::vector<Finding> evaluate_node(const NodeFacts& f, const Requirements& r) {
  std::vector<Finding> out;
  add_cpu_findings(f, r, out);

  if (f.shm_size_bytes < 0) {
    out.push_back(
        {"shm", Level::kBad, "no /dev/shm: mount an emptyDir with medium: Memory at /dev/shm"});
  } else if (f.shm_free_bytes < r.shm_min_bytes) {
    out.push_back({"shm", Level::kBad,
                   fmt::format("/dev/shm has {} free of {}, needs {}: mount an emptyDir with "
                               "medium: Memory and a sizeLimit of at least {} at /dev/shm",
                               mib(f.shm_free_bytes), mib(f.shm_size_bytes), mib(r.shm_min_bytes),
                               mib(r.shm_min_bytes))});
  } else {
    out.push_back({"shm", Level::kOk, fmt::format("/dev/shm {} free", mib(f.shm_free_bytes))});
  }

  if (f.efa_devices > 0 && f.memlock_bytes >= 0) {
    out.push_back({"memlock", Level::kBad,
                   fmt::format("locked memory is limited to {} with {} EFA devices: EFA needs "
                               "it unlimited (ulimit -l unlimited, or the container runtime's "
                               "default-ulimits)",
                               size_text(f.memlock_bytes), f.efa_devices)});
  } else {
    out.push_back(
        {"memlock", Level::kOk, f.memlock_bytes < 0 ? "unlimited" : size_text(f.memlock_bytes)});
  }

  const long long nofile_needed = 2LL * r.world_size + 256;
  if (f.nofile_soft < nofile_needed) {
    out.push_back({"nofile", Level::kBad,
                   fmt::format("open files are limited to {}, a rank of {} needs about {}: raise "
                               "ulimit -n",
                               f.nofile_soft, r.world_size, nofile_needed)});
  } else {
    out.push_back({"nofile", Level::kOk, std::to_string(f.nofile_soft)});
  }

  if (f.efa_devices > 0 && f.hugepages_total == 0) {
    out.push_back({"hugepages", Level::kWarn,
                   "no huge pages with EFA: libfabric's efa provider falls back to regular "
                   "pages for its buffers (set vm.nr_hugepages)"});
  } else {
    out.push_back({"hugepages", Level::kOk,
                   fmt::format("{} ({} free)", f.hugepages_total, f.hugepages_free)});
  }

  std::vector<std::string> missing;
  if (f.fi_info_found) {
    std::vector<std::string> wanted;
    if (f.efa_devices > 0) wanted.emplace_back("efa");
    if (r.backend == "fabric") {
      for (const auto& part : split_provider(r.provider)) wanted.push_back(part);
    }
    for (const auto& w : wanted) {
      if (std::find(f.providers.begin(), f.providers.end(), w) == f.providers.end() &&
          std::find(missing.begin(), missing.end(), w) == missing.end()) {
        missing.push_back(w);
      }
    }
  }
  if (!f.fi_info_found) {
    out.push_back({"providers",
                   r.backend == "fabric" || f.efa_devices > 0 ? Level::kWarn : Level::kOk,
                   "fi_info not found (Debian's libfabric-bin): libfabric providers not checked"});
  } else if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    out.push_back({"providers", Level::kBad,
                   fmt::format("libfabric has no {} provider{} (fi_info -l): install the "
                               "libfabric that brings it (the EFA installer's for efa), or set "
                               "DDP_FABRIC_PROVIDER to one it has",
                               list, missing.size() > 1 ? "s" : "")});
  } else {
    std::string list;
    for (const auto& p : f.providers) list += (list.empty() ? "" : ",") + p;
    out.push_back({"providers", Level::kOk, list});
  }

  int unresolved = 0;
  for (const auto& d : f.dns) {
    if (!d.resolved) {
      ++unresolved;
      out.push_back({"dns", Level::kBad,
                     fmt::format("cannot resolve '{}' ({}): check the headless Service and the "
                                 "pods' subdomain",
                                 d.name, d.error)});
    } else if (d.ms > r.slow_dns_ms) {
      out.push_back({"dns", Level::kWarn,
                     fmt::format("resolving '{}' took {:.0f} ms: lower ndots in the pod's "
                                 "dnsConfig, or use fully qualified names",
                                 d.name, d.ms)});
    }
  }
  if (unresolved == 0) {
    out.push_back({"dns", Level::kOk, fmt::format("{} peers resolved", f.dns.size())});
  }
  return out;
}

std::vector<std::vector<std::pair<int, int>>> ring_phases(int nodes) {
  std::vector<std::vector<std::pair<int, int>>> phases;
  if (nodes < 2) return phases;
  if (nodes == 2) return {{{0, 1}}};
  std::vector<std::pair<int, int>> even, odd, last;
  for (int i = 0; i < nodes; ++i) {
    const std::pair<int, int> link{i, (i + 1) % nodes};
    if (nodes % 2 == 1 && i == nodes - 1) {
      last.push_back(link);
    } else {
      (i % 2 == 0 ? even : odd).push_back(link);
    }
  }
  phases.push_back(even);
  phases.push_back(odd);
  if (!last.empty()) phases.push_back(last);
  return phases;
}

std::string node_label(const std::vector<NodeFacts>& nodes, int node) {
  std::set<std::string> names;
  for (const auto& n : nodes) names.insert(n.hostname);
  const bool distinct = names.size() == nodes.size() && names.count("") == 0;
  if (distinct && node >= 0 && node < static_cast<int>(nodes.size())) {
    return nodes[static_cast<std::size_t>(node)].hostname;
  }
  return "node " + std::to_string(node);
}

Verdict judge(const std::vector<NodeFacts>& nodes,
              const std::vector<std::vector<Finding>>& findings,
              const std::vector<LinkResult>& links, double min_gbps) {
  Verdict v;
  for (std::size_t n = 0; n < findings.size(); ++n) {
    for (const auto& f : findings[n]) {
      const std::string line = node_label(nodes, static_cast<int>(n)) + ": " + f.text;
      if (f.level == Level::kBad) {
        v.bad_nodes.insert(static_cast<int>(n));
        v.reason.emplace(static_cast<int>(n), line);
        v.problems.push_back(line);
      } else if (f.level == Level::kWarn) {
        v.warnings.push_back(line);
      }
    }
  }

  std::vector<double> rates, latencies;
  for (const auto& l : links) {
    if (!l.error.empty()) continue;
    rates.push_back(l.figures.out_gbps);
    rates.push_back(l.figures.in_gbps);
    latencies.push_back(l.figures.latency_us);
  }
  const bool relative = links.size() >= 3;
  v.median_gbps = median(rates);
  const double median_latency = median(latencies);
  std::map<int, std::pair<int, int>> slow_and_all;  // node -> (slow links, links)
  std::map<std::pair<int, int>, std::string> why;
  for (const auto& l : links) {
    const std::pair<int, int> key{l.from, l.to};
    ++slow_and_all[l.from].second;
    ++slow_and_all[l.to].second;
    std::string reason;
    if (!l.error.empty()) {
      reason = "unmeasurable: " + l.error;
    } else {
      const double worst = std::min(l.figures.out_gbps, l.figures.in_gbps);
      if (relative && worst < v.median_gbps / 2) {
        reason = fmt::format("{:.2f} Gb/s, {:.0f}x below the median ({:.2f} Gb/s)", worst,
                             worst > 0 ? v.median_gbps / worst : 0.0, v.median_gbps);
      } else if (min_gbps > 0 && worst < min_gbps) {
        reason =
            fmt::format("{:.2f} Gb/s, below DDP_DOCTOR_MIN_MBPS ({:.2f} Gb/s)", worst, min_gbps);
      } else if (relative && l.figures.latency_us > 2 * median_latency &&
                 l.figures.latency_us > median_latency + 100) {
        reason =
            fmt::format("{:.0f} µs latency, {:.0f}x the median ({:.0f} µs)", l.figures.latency_us,
                        l.figures.latency_us / median_latency, median_latency);
      }
    }
    if (reason.empty()) continue;
    v.slow_links.insert(key);
    why[key] = reason;
    ++slow_and_all[l.from].first;
    ++slow_and_all[l.to].first;
  }
  const auto in_every_link = [&](int node) {
    const auto& c = slow_and_all[node];
    return c.second >= 2 && c.first == c.second;
  };
  for (const auto& key : v.slow_links) {
    const bool a = in_every_link(key.first);
    const bool b = in_every_link(key.second);
    std::string line =
        node_label(nodes, key.first) + " <-> " + node_label(nodes, key.second) + ": " + why[key];
    std::vector<int> blamed;
    if (a && !b) {
      blamed = {key.first};
    } else if (b && !a) {
      blamed = {key.second};
    } else {
      blamed = {key.first, key.second};
    }
    if (blamed.size() == 1) {
      line += " (" + node_label(nodes, blamed[0]) + " is in every slow link it has: suspect it)";
    }
    for (int n : blamed) {
      v.bad_nodes.insert(n);
      v.reason.emplace(n, line);
    }
    v.problems.push_back(line);
  }
  return v;
}

std::string render(const std::vector<NodeFacts>& nodes,
                   const std::vector<std::vector<Finding>>& findings,
                   const std::vector<LinkResult>& links, const std::vector<SweepPoint>& sweep,
                   const std::string& sweep_note, const Verdict& verdict,
                   const Requirements& requirements) {
  std::string out = fmt::format("ddprun doctor: {} nodes x {} ranks, backend {}\n", nodes.size(),
                                requirements.nproc_per_node, requirements.backend);
  const char* checks[] = {"cpus",   "cpu",       "shm",       "memlock",
                          "nofile", "hugepages", "providers", "dns"};
  out += fmt::format("{:<18}", "node");
  for (const char* c : checks) out += fmt::format(" {:<10}", c);
  out += " efa\n";
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    out += fmt::format("{:<18}", node_label(nodes, static_cast<int>(n)));
    for (const char* c : checks) {
      Level worst = Level::kOk;
      if (n < findings.size()) {
        for (const auto& f : findings[n]) {
          if (f.check == c && static_cast<int>(f.level) > static_cast<int>(worst)) worst = f.level;
        }
      }
      out += fmt::format(" {:<10}", level_word(worst));
    }
    out += fmt::format(" {}\n", nodes[n].efa_devices);
  }
  if (!links.empty()) {
    out += fmt::format("{:<38} {:>12} {:>10} {:>10}\n", "link (ring)", "latency us", "out Gb/s",
                       "in Gb/s");
    for (const auto& l : links) {
      const std::string name = node_label(nodes, l.from) + " -> " + node_label(nodes, l.to);
      const bool slow = verdict.slow_links.count({l.from, l.to}) != 0;
      if (!l.error.empty()) {
        out += fmt::format("{:<38} {}\n", name, "FAILED: " + l.error);
      } else {
        out += fmt::format("{:<38} {:>12.1f} {:>10.2f} {:>10.2f}{}\n", name, l.figures.latency_us,
                           l.figures.out_gbps, l.figures.in_gbps, slow ? "  SLOW" : "");
      }
    }
  }
  if (!sweep.empty()) {
    out += "allreduce busbw (Gb/s):";
    for (const auto& p : sweep) {
      out += fmt::format(" {} {:.2f};", size_text(p.bytes), p.busbw_gbps);
    }
    out.back() = '\n';
  }
  if (!sweep_note.empty()) out += "allreduce sweep: " + sweep_note + "\n";
  for (const auto& w : verdict.warnings) out += "warning: " + w + "\n";
  if (verdict.problems.empty()) {
    out += fmt::format("verdict: healthy ({} nodes)\n", nodes.size());
  } else {
    std::string bad;
    for (int n : verdict.bad_nodes) bad += (bad.empty() ? "" : ", ") + node_label(nodes, n);
    out += fmt::format("verdict: {} problem{} on {}\n", verdict.problems.size(),
                       verdict.problems.size() > 1 ? "s" : "", bad);
    for (const auto& p : verdict.problems) out += "  " + p + "\n";
  }
  return out;
}

std::string facts_to_json(const NodeFacts& f, const std::vector<LinkResult>& links) {
  nlohmann::json j;
  j["node"] = f.node;
  j["hostname"] = f.hostname;
  j["address"] = f.address;
  j["probe_port"] = f.probe_port;
  j["usable_cpus"] = f.usable_cpus;
  j["cpu"] = {{"arch", f.cpu.arch},
              {"model", f.cpu.model},
              {"sve", f.cpu.sve},
              {"native_bf16", f.cpu.native_bf16},
              {"bf16_feature", f.cpu.bf16_feature}};
  j["fi_info_found"] = f.fi_info_found;
  j["providers"] = f.providers;
  j["efa_devices"] = f.efa_devices;
  j["memlock_bytes"] = f.memlock_bytes;
  j["nofile_soft"] = f.nofile_soft;
  j["hugepages_total"] = f.hugepages_total;
  j["hugepages_free"] = f.hugepages_free;
  j["shm_free_bytes"] = f.shm_free_bytes;
  j["shm_size_bytes"] = f.shm_size_bytes;
  j["dns"] = nlohmann::json::array();
  for (const auto& d : f.dns) {
    j["dns"].push_back(
        {{"name", d.name}, {"resolved", d.resolved}, {"ms", d.ms}, {"error", d.error}});
  }
  j["links"] = nlohmann::json::array();
  for (const auto& l : links) {
    j["links"].push_back({{"from", l.from},
                          {"to", l.to},
                          {"latency_us", l.figures.latency_us},
                          {"out_gbps", l.figures.out_gbps},
                          {"in_gbps", l.figures.in_gbps},
                          {"error", l.error}});
  }
  return j.dump();
}

NodeFacts facts_from_json(const std::string& json, std::vector<LinkResult>& links) {
  try {
    const auto j = nlohmann::json::parse(json);
    NodeFacts f;
    f.node = j.at("node").get<int>();
    f.hostname = j.at("hostname").get<std::string>();
    f.address = j.at("address").get<std::string>();
    f.probe_port = j.at("probe_port").get<int>();
    f.usable_cpus = j.at("usable_cpus").get<int>();
    const auto& cpu = j.at("cpu");
    f.cpu = {cpu.at("arch").get<std::string>(), cpu.at("model").get<std::string>(),
             cpu.at("sve").get<bool>(), cpu.at("native_bf16").get<bool>(),
             cpu.at("bf16_feature").get<std::string>()};
    f.fi_info_found = j.at("fi_info_found").get<bool>();
    f.providers = j.at("providers").get<std::vector<std::string>>();
    f.efa_devices = j.at("efa_devices").get<int>();
    f.memlock_bytes = j.at("memlock_bytes").get<long long>();
    f.nofile_soft = j.at("nofile_soft").get<long long>();
    f.hugepages_total = j.at("hugepages_total").get<long long>();
    f.hugepages_free = j.at("hugepages_free").get<long long>();
    f.shm_free_bytes = j.at("shm_free_bytes").get<long long>();
    f.shm_size_bytes = j.at("shm_size_bytes").get<long long>();
    for (const auto& d : j.at("dns")) {
      f.dns.push_back({d.at("name").get<std::string>(), d.at("resolved").get<bool>(),
                       d.at("ms").get<double>(), d.at("error").get<std::string>()});
    }
    for (const auto& l : j.at("links")) {
      LinkResult r;
      r.from = l.at("from").get<int>();
      r.to = l.at("to").get<int>();
      r.figures.latency_us = l.at("latency_us").get<double>();
      r.figures.out_gbps = l.at("out_gbps").get<double>();
      r.figures.in_gbps = l.at("in_gbps").get<double>();
      r.error = l.at("error").get<std::string>();
      links.push_back(r);
    }
    return f;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed doctor facts: ") + e.what());
  }
}

std::string sweep_to_json(const std::vector<SweepPoint>& sweep) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : sweep) {
    j.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}, {"busbw_gbps", p.busbw_gbps}});
  }
  return j.dump();
}

std::vector<SweepPoint> sweep_from_json(const std::string& json) {
  try {
    std::vector<SweepPoint> out;
    for (const auto& p : nlohmann::json::parse(json)) {
      out.push_back({p.at("bytes").get<long long>(), p.at("seconds").get<double>(),
                     p.at("busbw_gbps").get<double>()});
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed allreduce sweep: ") + e.what());
  }
}

std::string verdict_to_json(const Verdict& v) {
  nlohmann::json j;
  j["bad_nodes"] = v.bad_nodes;
  nlohmann::json reasons = nlohmann::json::object();
  for (const auto& [n, text] : v.reason) reasons[std::to_string(n)] = text;
  j["reason"] = reasons;
  j["problems"] = v.problems;
  j["warnings"] = v.warnings;
  j["median_gbps"] = v.median_gbps;
  return j.dump();
}

Verdict verdict_from_json(const std::string& json) {
  try {
    const auto j = nlohmann::json::parse(json);
    Verdict v;
    v.bad_nodes = j.at("bad_nodes").get<std::set<int>>();
    for (const auto& [n, text] : j.at("reason").items()) {
      v.reason[std::stoi(n)] = text.get<std::string>();
    }
    v.problems = j.at("problems").get<std::vector<std::string>>();
    v.warnings = j.at("warnings").get<std::vector<std::string>>();
    v.median_gbps = j.at("median_gbps").get<double>();
    return v;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("malformed doctor verdict: ") + e.what());
  }
}

}  // namespace ddprun::doctor
