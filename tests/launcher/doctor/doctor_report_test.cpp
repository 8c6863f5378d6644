#include "doctor/doctor_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace ddprun::doctor {
namespace {

constexpr long long kMiB = 1LL << 20;

NodeFacts healthy(int node) {
  NodeFacts f;
  f.node = node;
  f.hostname = "train-" + std::to_string(node);
  f.usable_cpus = 8;
  f.fi_info_found = true;
  f.providers = {"tcp", "ofi_rxm", "shm", "udp"};
  f.memlock_bytes = 8 * kMiB;
  f.nofile_soft = 1 << 20;
  f.shm_free_bytes = 4096 * kMiB;
  f.shm_size_bytes = 4096 * kMiB;
  f.dns = {{"train-1.train", true, 2.0, ""}};
  f.cpu = {"aarch64", "Neoverse V1 (AWS Graviton3)", true, true, "bf16"};
  return f;
}

Requirements two_ranks() {
  Requirements r;
  r.nproc_per_node = 2;
  r.world_size = 8;
  r.shm_min_bytes = default_shm_min_bytes(2);
  return r;
}

const Finding* bad(const std::vector<Finding>& findings, const std::string& check) {
  for (const auto& f : findings) {
    if (f.check == check && f.level == Level::kBad) return &f;
  }
  return nullptr;
}

int bad_count(const std::vector<Finding>& findings) {
  return static_cast<int>(std::count_if(findings.begin(), findings.end(),
                                        [](const Finding& f) { return f.level == Level::kBad; }));
}

TEST(DoctorReport, AHealthyNodeHasNoBadFinding) {
  const auto findings = evaluate_node(healthy(0), two_ranks());
  EXPECT_EQ(bad_count(findings), 0);
  EXPECT_EQ(findings.size(), 8u);  // one per check
}

// /proc/cpuinfo as a c7g.16xlarge prints it (one core of 64), and as an x86-64 node does.
TEST(DoctorReport, TheCpuModelComesFromCpuinfo) {
  const std::string graviton3 =
      "processor\t: 0\nBogoMIPS\t: 2100.00\n"
      "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
      "asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc "
      "flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\n"
      "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n"
      "CPU revision\t: 1\n\n";
  EXPECT_EQ(cpu_model_from_cpuinfo(graviton3), "Neoverse V1 (AWS Graviton3)");
  EXPECT_EQ(cpu_model_from_cpuinfo("CPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"),
            "Neoverse N1 (AWS Graviton2)");
  EXPECT_EQ(cpu_model_from_cpuinfo("CPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"),
            "Neoverse V2 (AWS Graviton4)");
  EXPECT_EQ(cpu_model_from_cpuinfo("CPU implementer\t: 0x61\nCPU part\t: 0x022\n"),
            "arm64 implementer 0x61 part 0x022");
  EXPECT_EQ(cpu_model_from_cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                                   "model name\t: AMD EPYC 9R14 96-Core Processor\n"),
            "AMD EPYC 9R14 96-Core Processor");
  EXPECT_EQ(cpu_model_from_cpuinfo(""), "unknown");
}

const Finding* find(const std::vector<Finding>& findings, const std::string& check) {
  for (const auto& f : findings) {
    if (f.check == check) return &f;
  }
  return nullptr;
}

// --bf16 on a CPU without native bfloat16 trains in float32: a warning that names the CPU, the
// feature it lacks and the fix. On a CPU with it, the finding lists SVE and bf16.
TEST(DoctorReport, Bf16OnACpuWithoutItIsAWarningNamingTheFix) {
  Requirements r = two_ranks();
  r.bf16 = true;
  const auto on_graviton3 = evaluate_node(healthy(0), r);
  const Finding* ok = find(on_graviton3, "cpu");
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(ok->level, Level::kOk);
  EXPECT_EQ(ok->text, "Neoverse V1 (AWS Graviton3) (aarch64, SVE, bf16)");

  NodeFacts graviton2 = healthy(0);
  graviton2.cpu = {"aarch64", "Neoverse N1 (AWS Graviton2)", false, false, "bf16"};
  const auto on_graviton2 = evaluate_node(graviton2, r);
  const Finding* warn = find(on_graviton2, "cpu");
  ASSERT_NE(warn, nullptr);
  EXPECT_EQ(warn->level, Level::kWarn);
  EXPECT_NE(warn->text.find("Neoverse N1 (AWS Graviton2)) lacks native bfloat16 (bf16)"),
            std::string::npos)
      << warn->text;
  EXPECT_NE(warn->text.find("drop --bf16"), std::string::npos) << warn->text;
  // Not asked for: no warning.
  const auto unasked = evaluate_node(graviton2, two_ranks());
  ASSERT_NE(find(unasked, "cpu"), nullptr);
  EXPECT_EQ(find(unasked, "cpu")->level, Level::kOk);
  EXPECT_EQ(find(unasked, "cpu")->text, "Neoverse N1 (AWS Graviton2) (aarch64, no SVE)");
}

TEST(DoctorReport, DefaultShmRoomIs64MiBPerRankAtLeast256) {
  EXPECT_EQ(default_shm_min_bytes(1), 256 * kMiB);
  EXPECT_EQ(default_shm_min_bytes(8), 512 * kMiB);
}

TEST(DoctorReport, EachBadFactIsNamedWithItsFix) {
  NodeFacts f = healthy(0);
  f.shm_free_bytes = 16 * kMiB;
  f.shm_size_bytes = 64 * kMiB;
  f.usable_cpus = 1;
  f.nofile_soft = 100;
  f.dns.push_back({"train-2.train", false, 5.0, "Name or service not known"});
  const auto findings = evaluate_node(f, two_ranks());
  ASSERT_NE(bad(findings, "shm"), nullptr);
  EXPECT_EQ(bad(findings, "shm")->text,
            "/dev/shm has 16 MiB free of 64 MiB, needs 256 MiB: mount an emptyDir with medium: "
            "Memory and a sizeLimit of at least 256 MiB at /dev/shm");
  ASSERT_NE(bad(findings, "cpus"), nullptr);
  EXPECT_NE(bad(findings, "cpus")->text.find("1 usable CPUs for 2 ranks"), std::string::npos);
  ASSERT_NE(bad(findings, "nofile"), nullptr);
  EXPECT_NE(bad(findings, "nofile")->text.find("raise ulimit -n"), std::string::npos);
  ASSERT_NE(bad(findings, "dns"), nullptr);
  EXPECT_NE(bad(findings, "dns")->text.find("cannot resolve 'train-2.train'"), std::string::npos);
  EXPECT_EQ(bad_count(findings), 4);
}

TEST(DoctorReport, EfaWantsUnlimitedMemlockAndItsProvider) {
  NodeFacts f = healthy(0);
  f.efa_devices = 1;
  const auto findings = evaluate_node(f, two_ranks());
  ASSERT_NE(bad(findings, "memlock"), nullptr);
  EXPECT_NE(bad(findings, "memlock")->text.find("EFA needs it unlimited"), std::string::npos);
  ASSERT_NE(bad(findings, "providers"), nullptr);
  EXPECT_NE(bad(findings, "providers")->text.find("no efa provider"), std::string::npos);
  f.memlock_bytes = -1;
  f.providers.push_back("efa");
  f.hugepages_total = 512;
  EXPECT_EQ(bad_count(evaluate_node(f, two_ranks())), 0);
}

TEST(DoctorReport, TheFabricBackendNeedsEachLayerOfItsProvider) {
  NodeFacts f = healthy(0);
  f.providers = {"tcp", "shm"};
  Requirements r = two_ranks();
  r.backend = "fabric";
  r.provider = "tcp;ofi_rxm";
  const auto findings = evaluate_node(f, r);
  ASSERT_NE(bad(findings, "providers"), nullptr);
  EXPECT_NE(bad(findings, "providers")->text.find("no ofi_rxm provider"), std::string::npos);
  r.backend = "gloo";
  EXPECT_EQ(bad(evaluate_node(f, r), "providers"), nullptr);
}

TEST(DoctorReport, TheRingsPhasesMeasureEveryLinkOnceAndNoNodeTwiceAtOnce) {
  EXPECT_TRUE(ring_phases(1).empty());
  ASSERT_EQ(ring_phases(2).size(), 1u);
  EXPECT_EQ(ring_phases(2)[0], (std::vector<std::pair<int, int>>{{0, 1}}));
  for (int n = 3; n <= 130; ++n) {
    const auto phases = ring_phases(n);
    EXPECT_EQ(phases.size(), n % 2 == 0 ? 2u : 3u) << n;
    std::set<std::pair<int, int>> seen;
    for (const auto& phase : phases) {
      std::set<int> busy;
      for (const auto& [from, to] : phase) {
        EXPECT_EQ(to, (from + 1) % n);
        EXPECT_TRUE(busy.insert(from).second) << n;
        EXPECT_TRUE(busy.insert(to).second) << n;
        EXPECT_TRUE(seen.insert({from, to}).second) << n;
      }
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(n)) << n;
  }
}

std::vector<LinkResult> ring(int n, double gbps) {
  std::vector<LinkResult> links;
  for (int i = 0; i < n; ++i) links.push_back({i, (i + 1) % n, {30, gbps, gbps}, ""});
  return links;
}

std::vector<NodeFacts> pods(int n) {
  std::vector<NodeFacts> nodes;
  for (int i = 0; i < n; ++i) nodes.push_back(healthy(i));
  return nodes;
}

TEST(DoctorReport, ALinkTenTimesSlowerIsNamedWithBothEnds) {
  auto links = ring(3, 8.0);
  links[1].figures.in_gbps = 0.8;  // train-1 <-> train-2, one direction
  const Verdict v = judge(pods(3), {}, links, 0);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_EQ(v.problems[0], "train-1 <-> train-2: 0.80 Gb/s, 10x below the median (8.00 Gb/s)");
  EXPECT_EQ(v.bad_nodes, (std::set<int>{1, 2}));
  EXPECT_EQ(v.slow_links, (std::set<std::pair<int, int>>{{1, 2}}));
}

TEST(DoctorReport, ANodeInEveryOneOfItsSlowLinksIsTheOneSuspected) {
  auto links = ring(6, 10.0);
  links[1].figures.out_gbps = 1.0;  // 1 -> 2
  links[2].figures.in_gbps = 1.2;   // 2 <- 3
  const Verdict v = judge(pods(6), {}, links, 0);
  EXPECT_EQ(v.bad_nodes, (std::set<int>{2}));
  ASSERT_EQ(v.problems.size(), 2u);
  EXPECT_NE(v.problems[0].find("(train-2 is in every slow link it has: suspect it)"),
            std::string::npos)
      << v.problems[0];
}

TEST(DoctorReport, HealthyNoiseIsNotAProblem) {
  auto links = ring(4, 9.0);
  links[0].figures.out_gbps = 6.0;  // 1.5x below: within the 2x allowed
  links[3].figures.latency_us = 55;
  EXPECT_TRUE(judge(pods(4), {}, links, 0).problems.empty());
}

TEST(DoctorReport, TwoNodesAreJudgedOnlyAgainstTheFloor) {
  std::vector<LinkResult> links = {{0, 1, {40, 0.5, 9.0}, ""}};
  EXPECT_TRUE(judge(pods(2), {}, links, 0).problems.empty());
  const Verdict v = judge(pods(2), {}, links, 1.0);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_EQ(v.problems[0], "train-0 <-> train-1: 0.50 Gb/s, below DDP_DOCTOR_MIN_MBPS (1.00 Gb/s)");
}

TEST(DoctorReport, AnUnmeasurableLinkIsAProblem) {
  auto links = ring(3, 5.0);
  links[2].error = "cannot connect to 10.0.0.1:4000 (Connection refused)";
  const Verdict v = judge(pods(3), {}, links, 0);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_EQ(v.problems[0],
            "train-2 <-> train-0: unmeasurable: cannot connect to 10.0.0.1:4000 (Connection "
            "refused)");
}

TEST(DoctorReport, TheTableAndVerdictNameTheBadNodeAndItsFix) {
  const auto nodes = pods(3);
  NodeFacts small = nodes[0];
  small.shm_free_bytes = 16 * kMiB;
  const Requirements r = two_ranks();
  std::vector<std::vector<Finding>> findings = {evaluate_node(small, r), evaluate_node(nodes[1], r),
                                                evaluate_node(nodes[2], r)};
  const auto links = ring(3, 4.0);
  const Verdict v = judge(nodes, findings, links, 0);
  EXPECT_EQ(v.bad_nodes, (std::set<int>{0}));
  EXPECT_EQ(v.reason.at(0).rfind("train-0: /dev/shm has 16 MiB free", 0), 0u) << v.reason.at(0);
  const std::string table = render(nodes, findings, links, {{4096, 1e-4, 0.5}}, "", v, r);
  EXPECT_NE(table.find("ddprun doctor: 3 nodes x 2 ranks, backend gloo"), std::string::npos);
  EXPECT_NE(table.find("train-1 -> train-2"), std::string::npos) << table;
  EXPECT_NE(table.find("allreduce busbw (Gb/s): 4 KiB 0.50\n"), std::string::npos) << table;
  EXPECT_NE(table.find("verdict: 1 problem on train-0\n  train-0: /dev/shm"), std::string::npos)
      << table;
  EXPECT_NE(render(nodes, {}, links, {}, "", judge(nodes, {}, links, 0), r)
                .find("verdict: healthy (3 nodes)"),
            std::string::npos);
}

TEST(DoctorReport, NodesOfOneHostnameAreNamedByNumber) {
  auto nodes = pods(2);
  nodes[1].hostname = nodes[0].hostname;
  EXPECT_EQ(node_label(nodes, 1), "node 1");
  EXPECT_EQ(node_label(pods(2), 1), "train-1");
}

TEST(DoctorReport, FactsVerdictAndSweepSurviveTheStore) {
  NodeFacts f = healthy(3);
  f.efa_devices = 2;
  f.dns.push_back({"x", false, 5000, "no answer within 5 s"});
  std::vector<LinkResult> links = {{3, 4, {12.5, 3.5, 4.5}, ""}, {3, 0, {}, "refused"}};
  std::vector<LinkResult> back_links;
  const NodeFacts back = facts_from_json(facts_to_json(f, links), back_links);
  EXPECT_EQ(back.hostname, "train-3");
  EXPECT_EQ(back.efa_devices, 2);
  EXPECT_EQ(back.cpu.model, "Neoverse V1 (AWS Graviton3)");
  EXPECT_TRUE(back.cpu.sve);
  EXPECT_TRUE(back.cpu.native_bf16);
  EXPECT_EQ(back.cpu.bf16_feature, "bf16");
  ASSERT_EQ(back.dns.size(), 2u);
  EXPECT_EQ(back.dns[1].error, "no answer within 5 s");
  ASSERT_EQ(back_links.size(), 2u);
  EXPECT_DOUBLE_EQ(back_links[0].figures.in_gbps, 4.5);
  EXPECT_EQ(back_links[1].error, "refused");

  auto ring3 = ring(3, 8.0);
  ring3[0].figures.out_gbps = 0.1;
  const Verdict v = judge(pods(3), {}, ring3, 0);
  const Verdict v2 = verdict_from_json(verdict_to_json(v));
  EXPECT_EQ(v2.bad_nodes, v.bad_nodes);
  EXPECT_EQ(v2.problems, v.problems);
  EXPECT_EQ(v2.reason, v.reason);

  const auto sweep = sweep_from_json(sweep_to_json({{1 << 20, 0.01, 1.5}}));
  ASSERT_EQ(sweep.size(), 1u);
  EXPECT_EQ(sweep[0].bytes, 1 << 20);
  EXPECT_THROW(verdict_from_json("{}"), std::runtime_error);
  EXPECT_THROW(facts_from_json("not json", back_links), std::runtime_error);
}

}  // namespace
}  // namespace ddprun::doctor
