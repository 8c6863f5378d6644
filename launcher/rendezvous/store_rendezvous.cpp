#include "rendezvous/store_rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/net/local_address.h"
#include "ddp/net/tcp_probe.h"
#include "ddp/store.h"
#include "ddp/store_server.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/member_order.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

constexpr auto kFirstProgress = std::chrono::seconds(2);
constexpr auto kProgressEvery = std::chrono::seconds(10);
// If the round's first joiner does not hand out the places, joiners 2..kStandIns+1 do, each
// kPlacesWait after the previous one.
constexpr auto kPlacesWait = std::chrono::seconds(2);
constexpr int kStandIns = 3;
constexpr auto kReleaseWait = std::chrono::seconds(30);
// While the endpoint does not answer, how often an agent looks for a moved store at its peers.
constexpr auto kPeerLookEvery = std::chrono::seconds(2);
constexpr auto kPeerProbe = std::chrono::milliseconds(300);
// The longest pause between two polls of etcd (StoreRendezvous::poll_cap).
constexpr auto kEtcdPollCap = std::chrono::milliseconds(250);

double seconds_of(Clock::duration d) {
  return std::chrono::duration_cast<milliseconds>(d).count() / 1000.0;
}

// Whether `host` names this machine: loopback, its hostname or FQDN, or one of its addresses.
// Decides which agent serves the c10d store when no node rank says so.
bool names_this_machine(const std::string& host, const HostFacts& facts,
                        const std::string& local_addr) {
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  if (host == facts.hostname || host == local_addr) return true;
  if (facts.fqdn && host == facts.fqdn()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  std::vector<std::string> targets;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    targets.push_back(ddp::net::numeric_address(ai->ai_addr));
  }
  freeaddrinfo(found);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return false;
  bool local = false;
  for (ifaddrs* i = ifs; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr == nullptr ||
        (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) {
      continue;
    }
    const std::string mine = ddp::net::numeric_address(i->ifa_addr);
    local = std::find(targets.begin(), targets.end(), mine) != targets.end();
  }
  freeifaddrs(ifs);
  return local;
}

// Resolves `host` and opens (then closes) a TCP connection to `port`; "" on success, else why
// not. Keeps the c10d client from logging a warning for every refused attempt.
}  // namespace

StoreRendezvous::StoreRendezvous(const LaunchConfig& config, const HostFacts& host,
                                 std::function<void()> poll_interrupt)
    : config_(config), host_(host), poll_interrupt_(std::move(poll_interrupt)) {
  const auto deadline = Clock::now() + config.rdzv.join_timeout;
  store_host_ = config.store_host;
  store_port_ = config.store_port;
  etcd_ = config.rdzv_backend == RdzvBackend::kEtcd;
  if (etcd_) {
    connect_with_retry(deadline);
    return;
  }
  bool host_it = false;
  if (config.rdzv_backend == RdzvBackend::kStatic) {
    host_it = config.node_rank == 0;
  } else if (config.rdzv.is_host) {
    host_it = *config.rdzv.is_host;
  } else if (config.node_rank) {
    host_it = *config.node_rank == 0;
  } else {
    host_it = names_this_machine(config.store_host, host, config.local_addr);
  }
  // With c10d and nothing naming the host, another agent on this machine may win the port:
  // this one then joins it, and hosts after all if that agent goes away first.
  may_host_ = host_it && config.rdzv_backend != RdzvBackend::kStatic &&
              !config.rdzv.is_host.value_or(false) && !config.node_rank;
  // A recreated pod 0 finds the store its job moved to rather than serving a second one.
  if (host_it && find_moved_store()) return;
  if (host_it && try_host()) return;
  connect_with_retry(deadline);
}

bool StoreRendezvous::try_host() {
  try {
    ddp::StoreServerOptions options;
    options.port = config_.store_port;
    options.join_token = config_.rdzv.join_token;
    agents_server_ = std::make_shared<ddp::StoreServer>(options);
    server_ = ddp::Store::connect("127.0.0.1", agents_server_->port(), config_.rdzv.read_timeout,
                                  {std::nullopt, ddp::StoreProtocol::kModern});
  } catch (const ddp::StoreError& e) {
    agents_server_.reset();
    if (!may_host_) {
      throw ddp::StoreError(std::string(e.what()) +
                            "; is another job using this port? choose another --master-port");
    }
    if (!said_not_host_) {
      ddp::log::info("the store's port is taken here ({}); joining the agent that holds it",
                     e.what());
      said_not_host_ = true;
    }
    return false;
  }
  hosts_store_ = true;
  store_port_ = agents_server_->port();
  store_ = server_->with_prefix("ddprun/" + config_.run_id);
  ddp::log::info("serving the rendezvous store on port {}", store_port_);
  return true;
}

StoreRendezvous::~StoreRendezvous() = default;

std::string StoreRendezvous::where() const {
  return (etcd_ ? "etcd at " : "the rendezvous store at ") + store_host_ + ":" +
         std::to_string(store_port_);
}

std::shared_ptr<ddp::Store> StoreRendezvous::open_store(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  if (etcd_) {
    ddp::EtcdOptions options;
    options.endpoint = config_.store_host + ":" + std::to_string(config_.store_port);
    options.protocol = config_.rdzv.etcd_protocol;
    options.cacert = config_.rdzv.etcd_cacert;
    options.cert = config_.rdzv.etcd_cert;
    options.key = config_.rdzv.etcd_key;
    // One attempt of at most 2 s, so that a signal is seen between attempts.
    auto client = ddp::Store::etcd(options, std::clamp(left, milliseconds(1), milliseconds(2000)),
                                   config_.rdzv.read_timeout);
    return client->with_prefix(config_.rdzv.etcd_prefix + "/" + config_.run_id);
  }
  auto client =
      ddp::Store::connect(store_host_, store_port_, std::max(left, config_.rdzv.read_timeout),
                          {config_.rdzv.join_token, ddp::StoreProtocol::kModern});
  // A second connection for what the agent asks while its workers run (its beat, the round's
  // failure, nodes waiting), whose requests give up after the heartbeat limit: if the store's
  // host vanishes without closing its sockets, this node learns it within that limit rather
  // than after read_timeout (heartbeat.h).
  monitor_store_ = ddp::Store::connect(store_host_, store_port_, heartbeat_limit(),
                                       {config_.rdzv.join_token, ddp::StoreProtocol::kModern})
                       ->with_prefix("ddprun/" + config_.run_id);
  return client->with_prefix("ddprun/" + config_.run_id);
}

milliseconds StoreRendezvous::heartbeat_limit() const {
  return config_.rdzv.keep_alive_interval * config_.rdzv.keep_alive_max_attempt;
}

void StoreRendezvous::connect_with_retry(Clock::time_point deadline) {
  const auto start = Clock::now();
  auto next_report = start + kFirstProgress;
  auto backoff = milliseconds(50);
  auto next_peer_look = start;
  for (;;) {
    poll_interrupt_();
    const std::string why = try_connect(deadline, next_peer_look);
    if (why.empty()) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw ddp::StoreError(
          "cannot reach " + where() + " within " +
          std::to_string(seconds_of(now - start)).substr(0, 5) + " s (" + why + "); " +
          (etcd_ ? "check that etcd runs there and --rdzv-endpoint names it"
                 : "check that node 0 runs and --master-addr/--rdzv-endpoint names it") +
          ", or raise --rdzv-conf join_timeout");
    }
    if (now >= next_report) {
      ddp::log::info("still waiting for {} after {:.0f} s: {}", where(), seconds_of(now - start),
                     why);
      next_report = now + kProgressEvery;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

std::string StoreRendezvous::try_connect(Clock::time_point deadline,
                                         Clock::time_point& next_peer_look) {
  const std::string why = etcd_ ? std::string() : ddp::net::probe_tcp(store_host_, store_port_);
  if (!why.empty()) {
    // Nothing serves the port this agent may host: the agent that took it went away first.
    if (may_host_ && try_host()) return "";
    // Nothing at the endpoint: the store may have moved off it (rendezvous.h).
    if (Clock::now() >= next_peer_look) {
      if (find_moved_store()) return "";
      next_peer_look = Clock::now() + kPeerLookEvery;
    }
    return why;
  }
  try {
    store_ = open_store(deadline);
    ddp::log::debug("connected to {}", where());
    return "";
  } catch (const ddp::JoinRefusedError&) {
    throw;  // retrying cannot help
  } catch (const ddp::StoreUnreachableError& e) {
    return e.cause();  // the caller says where, and for how long
  } catch (const ddp::StoreError& e) {
    return e.what();
  }
}

void StoreRendezvous::settle_worker_store(const NodeAssignment& node) {
  // A fresh store every round after the first, on every backend: PyTorch 2.x workers key
  // nothing by attempt, so in one store shared across rounds a restarted rank reads its peers'
  // gloo addresses of the round before (rendezvous.h). A worker left over from an earlier round
  // finds its store closed rather than mixing with this one.
  release_worker_store();
  if (!etcd_ && node.round == 0 && config_.share_worker_store) {
    // Round 0's workers use the agents' store at the rendezvous endpoint, as under torchrun:
    // nothing was written there before them.
    worker_store_ = {store_host_, store_port_, true};
    return;
  }
  const std::string k = key(node.round, "worker_store");
  if (node.group_rank == 0) {
    int port = 0;
    if (config_.share_worker_store) {
      worker_server_ = ddp::Store::host(config_.worker_store_port, config_.rdzv.read_timeout,
                                        config_.rdzv.join_token);
      port = worker_server_->port();
      ddp::log::info("serving the workers' store on port {} (round {})", port, node.round);
    } else {
      // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: worker rank 0 serves it, on a port free now (as
      // torchrun's RendezvousStoreInfo.build picks one).
      port = config_.worker_store_port != 0 ? config_.worker_store_port : ddp::net::free_tcp_port();
    }
    store_->set(k, worker_store_address() + " " + std::to_string(port));
  }
  const std::string value = store_->get(k);
  const auto space = value.rfind(' ');
  worker_store_ = {value.substr(0, space), std::stoi(value.substr(space + 1)),
                   config_.share_worker_store};
  if (node.group_rank != 0 && config_.share_worker_store) {
    // Presents the join token, which admits this node's workers, and shows now, rather than in
    // the workers, whether node 0's store can be reached from here.
    worker_client_ =
        ddp::Store::connect(worker_store_.host, worker_store_.port, config_.rdzv.read_timeout,
                            {config_.rdzv.join_token, ddp::StoreProtocol::kModern});
  }
}

std::string StoreRendezvous::worker_store_address() const {
  // The name the other nodes reach this agent's store by (the master's, as torchrun gives it),
  // else --local-addr or the address that routes to the store.
  if (hosts_store_) return store_host_;
  return config_.local_addr.empty() ? ddp::net::local_address_towards(store_host_)
                                    : config_.local_addr;
}

void StoreRendezvous::release_worker_store() {
  worker_client_.reset();
  worker_server_.reset();  // its port is free again for the next round's node 0
}

std::shared_ptr<ddp::Store> StoreRendezvous::round_store(int round, const std::string& topic) {
  return store_->with_prefix(key(round, topic));
}

std::shared_ptr<ddp::Store> StoreRendezvous::monitor_store(int round, const std::string& topic) {
  return (monitor_store_ ? monitor_store_ : store_)->with_prefix(key(round, topic));
}

std::string StoreRendezvous::key(int round, const std::string& name) const {
  return "round" + std::to_string(round) + "/" + name;
}

NodeAssignment StoreRendezvous::join() {
  for (;;) {
    try {
      return join_current();
    } catch (const MovedAway&) {
      continue;  // on the job's live store now
    } catch (const ddp::JoinRefusedError&) {
      throw;
    } catch (const ddp::StoreError& e) {
      if (!store_gone()) throw;
      ddp::log::warn("the rendezvous store stopped answering while this node joined ({})",
                     e.what());
      if (!fail_over(next_restarts_)) throw;
    }
  }
}

NodeAssignment StoreRendezvous::join_current() {
  const auto deadline = Clock::now() + config_.rdzv.join_timeout;
  // The job's current round: "0" for the first agent ever, later the round in progress.
  int round = std::stoi(store_->compare_set("round", "", "0"));
  for (;;) {
    bool late = false;
    NodeAssignment node = try_join(round, deadline, late);
    if (!late) {
      node.restarts = restarts_before(round);
      note_round_members(round);
      admit_round_members(round);
      settle_worker_store(node);
      return node;
    }
    // The round closed without this node: wait for the group's next round. Below the maximum
    // size, the running nodes make one as soon as they see this node waiting.
    const int closed = std::stoi(store_->get(key(round, "closed")));
    if (closed < config_.max_nodes) {
      store_->add(key(round, "waiting"), 1);
      ddp::log::info(
          "round {} is running with {} of at most {} nodes; waiting for the group to take this "
          "node in at its next round",
          round, closed, config_.max_nodes);
    } else {
      ddp::log::info("round {} is already running without this node; waiting for the next round",
                     round);
    }
    auto backoff = milliseconds(10);
    for (;;) {
      poll_interrupt_();
      const int current = std::stoi(store_->compare_set("round", "", "0"));
      if (current != round) {
        round = current;
        break;
      }
      if (Clock::now() >= deadline) {
        throw ddp::StoreError("round " + std::to_string(round) +
                              " is full and running without this node, and no new round began "
                              "within the join timeout; is an extra pod running with the same "
                              "job, or is --nnodes too small?");
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, milliseconds(500));
    }
  }
}

void StoreRendezvous::assign_places(int round, int closed) {
  std::vector<std::string> member_keys;
  for (int i = 1; i <= closed; ++i)
    member_keys.push_back(key(round, "member/" + std::to_string(i)));
  const std::vector<std::string> records = store_->multi_get(member_keys);
  std::vector<RoundMember> members;
  std::vector<json> record_of(static_cast<std::size_t>(closed) + 1);  // by join index
  for (int i = 1; i <= closed; ++i) {
    const json j = json::parse(records[static_cast<std::size_t>(i - 1)]);
    members.push_back({i, j.value("node_rank", -1), j.value("preferred", -1), j.value("nproc", 1),
                       j.value("host", "")});
    record_of[static_cast<std::size_t>(i)] = j;
  }
  std::vector<std::string> place_keys;
  for (int i = 1; i <= closed; ++i) place_keys.push_back(key(round, "place/" + std::to_string(i)));
  // Two nodes claiming one node rank: every node fails with the same line.
  std::map<int, const RoundMember*> claimed;
  for (const RoundMember& m : members) {
    if (m.node_rank < 0) continue;
    const auto [it, fresh] = claimed.emplace(m.node_rank, &m);
    if (!fresh) {
      const std::string error = "error:node rank " + std::to_string(m.node_rank) +
                                " is claimed by two nodes (" + it->second->host + " and " + m.host +
                                "); give each node its own --node-rank or pod index";
      store_->multi_set(place_keys, std::vector<std::string>(place_keys.size(), error));
      return;
    }
  }
  order_members(members);  // member_order.h
  int world_size = 0;
  json addresses = json::array();
  json reach = {{"addresses", json::array()}, {"store_host", -1}};
  for (const RoundMember& m : members) {
    world_size += m.nproc;
    const json& record = record_of[static_cast<std::size_t>(m.join_index)];
    addresses.push_back(record.value("address", ""));
    if (record.value("hosts_store", false)) reach["store_host"] = reach["addresses"].size();
    reach["addresses"].push_back(record.value("reach", ""));
  }
  std::vector<std::string> places(place_keys.size());
  int offset = 0;
  // The members' agents' addresses by group rank: the store's host admits their workers.
  place_keys.push_back(key(round, "addresses"));
  places.push_back(addresses.dump());
  // Where each member is reached, and which one hosts the store: where the store moves to.
  place_keys.push_back(key(round, "reach"));
  places.push_back(reach.dump());
  for (int g = 0; g < closed; ++g) {
    const RoundMember& m = members[static_cast<std::size_t>(g)];
    places[static_cast<std::size_t>(m.join_index - 1)] =
        json{{"group_rank", g}, {"rank_offset", offset}, {"world_size", world_size}}.dump();
    offset += m.nproc;
    // Each node's host, to name it if it is lost, and its heartbeat counter, so that the
    // counters can be read at once (heartbeat.h).
    place_keys.push_back(key(round, "node/" + std::to_string(g)));
    places.push_back(m.host);
    place_keys.push_back(key(round, "beat/" + std::to_string(g)));
    places.push_back("0");
  }
  store_->multi_set(place_keys, places);  // one request: no agent sees half of it
}

void StoreRendezvous::wait_until_closed(int round, Clock::time_point start,
                                        Clock::time_point deadline) {
  // After a loss the agent that ended the previous round wrote how many nodes survived it
  // (advance); it did so before it moved the job on, so the key is there for every survivor.
  // After the store moved, the round also needs a majority of the previous round's nodes.
  const int expected = count_or(key(round, "survivors_expected"), -1);
  const int quorum = count_or(key(round, "quorum"), 0);
  const int members = count_or(key(round, "members_expected"), -1);
  auto backoff = milliseconds(1);
  auto next_report = start + kFirstProgress;
  std::optional<Clock::time_point> min_reached;
  auto next_peer_look = start + kPeerLookEvery;
  while (!store_->check({key(round, "closed")})) {
    poll_interrupt_();
    const auto now = Clock::now();
    const int joined = static_cast<int>(store_->add(key(round, "joined"), 0));
    if (joined == 1 && leave_for_moved_store(next_peer_look)) throw MovedAway{};
    if (joined >= std::max(config_.min_nodes, quorum)) {
      if (!min_reached) min_reached = now;
      if (now - *min_reached >= config_.rdzv.last_call_timeout ||
          survivors_in(round, expected, joined) || (members > 0 && joined >= members)) {
        store_->compare_set(key(round, "closed"), "", std::to_string(joined));
        continue;
      }
    }
    if (quorum > 0 && joined < quorum && now - start >= 2 * failover_window()) {
      throw ddp::StoreError(fmt::format(
          "only {} of round {}'s nodes joined round {} within {:.0f} s, fewer than the {} it needs "
          "after a node was lost: this node may be cut off from the others, and stops rather "
          "than train as a second job; check the network between the pods",
          joined, round - 1, round, seconds_of(now - start), quorum));
    }
    if (now >= deadline) {
      throw ddp::StoreError(
          "rendezvous timed out: " + std::to_string(joined) + " of " +
          std::to_string(config_.min_nodes) + " nodes joined round " + std::to_string(round) +
          " within " + std::to_string(seconds_of(now - start)).substr(0, 5) +
          " s; check that every node's pod runs and uses the same --nnodes, --rdzv-id and "
          "store address, or raise --rdzv-conf join_timeout");
    }
    if (now >= next_report) {
      report_waiting(round, joined, min_reached.has_value(), start);
      next_report = now + kProgressEvery;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, poll_cap(milliseconds(50)));
  }
}

void StoreRendezvous::report_waiting(int round, int joined, bool min_reached,
                                     Clock::time_point start) {
  if (min_reached) {
    ddp::log::info(
        "{} nodes joined round {}, at least {} and at most {}: it closes {:.0f} s after the "
        "minimum was reached (last_call_timeout) unless {} join first",
        joined, round, config_.min_nodes, config_.max_nodes,
        seconds_of(config_.rdzv.last_call_timeout), config_.max_nodes);
  } else {
    ddp::log::info("waiting for nodes: {} of {} joined round {} after {:.0f} s", joined,
                   config_.min_nodes, round, seconds_of(Clock::now() - start));
  }
}

int StoreRendezvous::count_or(const std::string& k, int fallback) {
  return store_->check({k}) ? std::stoi(store_->get(k)) : fallback;
}

bool StoreRendezvous::survivors_in(int round, int expected, int joined) {
  if (expected <= 0) return false;
  const int survivors = static_cast<int>(store_->add(key(round, "survivors"), 0));
  if (survivors < expected) return false;
  ddp::log::info(
      "round {}: every node that survived round {} is in ({} survivors, {} nodes); it closes "
      "now, without the last call a growth waits for",
      round, round - 1, survivors, joined);
  return true;
}

NodeAssignment StoreRendezvous::try_join(int round, Clock::time_point deadline, bool& late) {
  const auto start = Clock::now();
  const int index = static_cast<int>(store_->add(key(round, "joined"), 1));
  json me = {{"node_rank", config_.node_rank.value_or(-1)},
             {"preferred", preferred_rank_},
             {"nproc", config_.nproc_per_node},
             {"host", config_.local_addr.empty() ? host_.hostname : config_.local_addr},
             {"address", store_->seen_as()},
             {"reach", worker_store_address()},
             {"hosts_store", hosts_store_}};
  store_->set(key(round, "member/" + std::to_string(index)), me.dump());
  if (index == config_.max_nodes)
    store_->compare_set(key(round, "closed"), "", std::to_string(index));
  // A node that had a place in the previous round is one of its survivors.
  if (last_round_ >= 0 && last_round_ == round - 1) store_->add(key(round, "survivors"), 1);
  wait_until_closed(round, start, deadline);
  const int closed = std::stoi(store_->get(key(round, "closed")));
  if (index > closed) {
    late = true;
    return {};
  }

  // The round's first joiner orders the members and hands each its place; every other agent
  // reads its own key. So a round of N nodes costs the store O(N) requests, not N² reads of
  // every member by every agent. The places follow from the members alone: should the first
  // joiner stall or die, the next three write the same ones, 2, 4 and 6 s later (not all of
  // them, which would be N² again).
  if (index == 1) assign_places(round, closed);
  const std::string place_key = key(round, "place/" + std::to_string(index));
  auto stand_in_at = Clock::time_point::max();
  if (index > 1 && index <= kStandIns + 1) stand_in_at = Clock::now() + kPlacesWait * (index - 1);
  auto wait = milliseconds(1);
  while (!store_->check({place_key})) {
    poll_interrupt_();
    const auto now = Clock::now();
    if (now >= stand_in_at) {
      stand_in_at = Clock::time_point::max();
      assign_places(round, closed);
      continue;
    }
    if (now >= deadline) {
      throw ddp::StoreError("round " + std::to_string(round) +
                            " closed, but no node handed out the places within the join "
                            "timeout; did its first nodes exit during the rendezvous?");
    }
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, poll_cap(milliseconds(20)));
  }
  const std::string text = store_->get(place_key);
  if (text.rfind("error:", 0) == 0) {
    // The store's host leaves last, so that every node reads the error rather than a lost store.
    store_->add(key(round, "placed"), 1);
    if (hosts_store_) wait_for_count(round, "placed", closed, Clock::now() + kReleaseWait);
    throw ddp::ConfigError(text.substr(6));
  }
  const json place = json::parse(text);
  NodeAssignment node;
  node.round = round;
  node.group_world_size = closed;
  node.group_rank = place.at("group_rank").get<int>();
  node.rank_offset = place.at("rank_offset").get<int>();
  node.world_size = place.at("world_size").get<int>();
  preferred_rank_ = node.group_rank;
  last_round_ = round;
  return node;
}

milliseconds StoreRendezvous::poll_cap(milliseconds tcp_cap) const {
  // An agent's TCP store answers a read in microseconds; etcd's gateway in about a millisecond
  // of its CPU (JSON, base64, a range), from every agent: polls at most 4 times a second.
  return etcd_ ? std::max(tcp_cap, kEtcdPollCap) : tcp_cap;
}

std::optional<FailureReport> StoreRendezvous::failure(int round) {
  const std::string k = key(round, "failure");
  return monitored([&](ddp::Store& store) -> std::optional<FailureReport> {
    if (!store.check({k})) return std::nullopt;
    return FailureReport::from_json(store.get(k));
  });
}

FailureReport StoreRendezvous::publish_failure(int round, const FailureReport& report) {
  const std::string mine = report.to_json();
  std::string stored = store_->compare_set(key(round, "failure"), "", mine);
  if (stored == mine) return report;
  FailureReport existing = FailureReport::from_json(stored);
  if (existing.is_consequence() && !report.is_consequence()) {
    stored = store_->compare_set(key(round, "failure"), stored, mine);
    if (stored == mine) return report;
    existing = FailureReport::from_json(stored);
  }
  return existing;
}

void StoreRendezvous::revise_failure(int round, const FailureReport& before,
                                     const FailureReport& after) {
  store_->compare_set(key(round, "failure"), before.to_json(), after.to_json());
}

void StoreRendezvous::admit_round_members(int round) {
  if (!agents_server_ || config_.rdzv.join_token.empty()) return;
  // Written with the places, which this node has read: there already.
  member_addresses_ =
      json::parse(store_->get(key(round, "addresses"))).get<std::vector<std::string>>();
  admit_member_addresses();
  ddp::log::debug("the store admits the workers of round {}'s members: {}", round,
                  json(member_addresses_).dump());
}

void StoreRendezvous::admit_member_addresses() {
  std::vector<std::string> admitted;
  for (const std::string& a : member_addresses_) {
    if (!a.empty()) admitted.push_back(a);
  }
  agents_server_->admit_members(admitted);
}

void StoreRendezvous::stand_in_for_lost(int round, int group_rank) {
  // The lost node's workers lose their admission on the agents' store at once (a pod that
  // takes over its address is not one of them), unless a member that remains shares it.
  const auto g = static_cast<std::size_t>(group_rank);
  if (agents_server_ && g < member_addresses_.size() && !member_addresses_[g].empty()) {
    member_addresses_[g].clear();
    admit_member_addresses();
  }
  if (store_->add(key(round, "lost/" + std::to_string(group_rank)), 1) != 1) return;
  store_->add(key(round, "stopped"), 1);
  store_->add(key(round, "settled"), 1);
}

void StoreRendezvous::acknowledge_stop(int round, bool leaving) {
  try {
    store_->add(key(round, "stopped"), 1);
    // A leaving node will not read the final root cause: the host must not wait for it.
    if (leaving) store_->add(key(round, "settled"), 1);
  } catch (const ddp::StoreError& e) {
    ddp::log::warn("could not tell the other nodes that this node stopped: {}", e.what());
  }
}

void StoreRendezvous::wait_for_count(int round, const std::string& name, int target,
                                     Clock::time_point deadline) {
  auto backoff = milliseconds(5);
  while (store_->add(key(round, name), 0) < target && Clock::now() < deadline) {
    if (on_wait_) on_wait_();
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, poll_cap(milliseconds(5)));
  }
}

FailureReport StoreRendezvous::settle_failure(int round, int nodes, const FailureReport& fallback) {
  try {
    wait_for_count(round, "stopped", nodes,
                   Clock::now() + std::max(config_.shutdown_timeout, heartbeat_limit()) +
                       std::chrono::seconds(5));
    auto settled = failure(round);
    store_->add(key(round, "settled"), 1);
    return settled ? *settled : fallback;
  } catch (const ddp::StoreError& e) {
    ddp::log::warn("could not agree on the root cause with the other nodes: {}", e.what());
    return fallback;
  }
}

template <typename Fn>
auto StoreRendezvous::monitored(Fn&& fn) -> decltype(fn(std::declval<ddp::Store&>())) {
  if (!monitor_store_) return fn(*store_);
  return within_heartbeat_limit(store_host_, store_port_, heartbeat_limit(),
                                [&] { return fn(*monitor_store_); });
}

void StoreRendezvous::beat(int round, int group_rank, int64_t delta) {
  const std::string k = key(round, "beat/" + std::to_string(group_rank));
  monitored([&](ddp::Store& store) { return store.add(k, delta); });
}

std::vector<int64_t> StoreRendezvous::beats(int round, int nodes) {
  std::vector<std::string> keys;
  for (int g = 0; g < nodes; ++g) keys.push_back(key(round, "beat/" + std::to_string(g)));
  // The counters exist from assign_places on, so the read never waits for a key.
  const std::vector<std::string> values = store_->multi_get(keys);
  std::vector<int64_t> counts;
  for (const auto& v : values) counts.push_back(v.empty() ? 0 : std::stoll(v));
  return counts;
}

std::string StoreRendezvous::node_host(int round, int group_rank) {
  const std::string k = key(round, "node/" + std::to_string(group_rank));
  return store_->check({k}) ? store_->get(k) : "unknown host";
}

int StoreRendezvous::nodes_waiting(int round) {
  const std::string k = key(round, "waiting");
  return static_cast<int>(monitored([&](ddp::Store& store) { return store.add(k, 0); }));
}

int StoreRendezvous::restarts_before(int round) {
  if (round == 0 || !store_->check({key(round, "restarts")})) return 0;
  return std::stoi(store_->get(key(round, "restarts")));
}

void StoreRendezvous::advance(int round, int restarts, std::optional<int> survivors, int quorum,
                              int members) {
  release_worker_store();  // the round is over: its workers are gone
  next_restarts_ = restarts;
  // The first agent's count stands: every agent of the round computes the same one.
  store_->compare_set(key(round + 1, "restarts"), "", std::to_string(restarts));
  if (survivors) {
    store_->compare_set(key(round + 1, "survivors_expected"), "", std::to_string(*survivors));
  }
  if (quorum > 0) store_->compare_set(key(round + 1, "quorum"), "", std::to_string(quorum));
  if (members > 0) {
    store_->compare_set(key(round + 1, "members_expected"), "", std::to_string(members));
  }
  store_->compare_set("round", std::to_string(round), std::to_string(round + 1));
}

milliseconds StoreRendezvous::failover_window() const {
  // Every node sees a silent host within the heartbeat limit of its last answered beat, and the
  // nodes beat up to an interval apart.
  return heartbeat_limit() + config_.rdzv.keep_alive_interval;
}

void StoreRendezvous::note_round_members(int round) {
  // Written with the places, which this node has read: there already.
  const json j = json::parse(store_->get(key(round, "reach")));
  reach_ = j.at("addresses").get<std::vector<std::string>>();
  store_host_rank_ = j.value("store_host", -1);
}

bool StoreRendezvous::store_gone() const {
  if (hosts_store_ || etcd_ || last_round_ < 0) return false;
  return !ddp::net::probe_tcp(store_host_, store_port_, std::chrono::seconds(1)).empty();
}

bool StoreRendezvous::fail_over(int restarts) {
  // The host may be lost or this node cut off: a majority of the round's nodes decides.
  return move_store(restarts, static_cast<int>(reach_.size()) / 2 + 1);
}

bool StoreRendezvous::move_store_from_leaving_host(const FailureReport& cause, int restarts) {
  if (hosts_store_ || store_host_rank_ < 0 || cause.kind != "agent" || cause.signal == 0 ||
      cause.node_rank != store_host_rank_) {
    return false;
  }
  // Its workers stopped with the others' (acknowledge_stop): it exits now, with the store.
  ddp::log::info("node {}, the rendezvous store's host, is leaving: the store moves first",
                 store_host_rank_);
  return move_store(restarts, 0);
}

bool StoreRendezvous::move_store(int restarts, int quorum) {
  if (etcd_ || config_.rdzv_backend == RdzvBackend::kStatic ||
      config_.min_nodes == config_.max_nodes || hosts_store_ || reach_.empty()) {
    return false;
  }
  const int nodes = static_cast<int>(reach_.size());
  const int survivors = store_host_rank_ >= 0 ? nodes - 1 : nodes;
  ddp::log::warn(
      "the rendezvous store's host ({}:{}) is gone; round {}'s {} other nodes move the store to "
      "the lowest of them that answers",
      store_host_, store_port_, last_round_, survivors);
  release_worker_store();
  store_.reset();
  monitor_store_.reset();
  for (int g = 0; g < nodes; ++g) {
    const std::string& address = reach_[static_cast<std::size_t>(g)];
    if (g == store_host_rank_ || address.empty()) continue;
    if (g == preferred_rank_) {  // this node's group rank in that round: it hosts now
      store_host_ = address;
      may_host_ = false;
      try_host();  // throws when the port is taken here
    } else if (!reach_store_at(address, Clock::now() + failover_window())) {
      ddp::log::warn("node {} ({}) did not take the store over within {:.0f} s; trying the next", g,
                     address, seconds_of(failover_window()));
      continue;
    }
    store_host_rank_ = g;
    ddp::log::warn("the rendezvous store moved to node {} of round {} ({}:{})", g, last_round_,
                   store_host_, store_port_);
    seed_round_after_move(restarts, survivors, quorum);
    return true;
  }
  return false;
}

bool StoreRendezvous::reach_store_at(const std::string& address, Clock::time_point deadline) {
  auto backoff = milliseconds(50);
  for (;;) {
    poll_interrupt_();
    if (ddp::net::probe_tcp(address, config_.store_port, kPeerProbe).empty() &&
        connect_store_at(address, deadline)) {
      return true;
    }
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

bool StoreRendezvous::connect_store_at(const std::string& address, Clock::time_point deadline) {
  const std::string before_host = store_host_;
  const int before_port = store_port_;
  store_host_ = address;
  store_port_ = config_.store_port;
  try {
    store_ = open_store(deadline);
    return true;
  } catch (const ddp::JoinRefusedError&) {
    throw;
  } catch (const ddp::StoreError& e) {
    ddp::log::debug("{}:{} does not serve the store: {}", address, store_port_, e.what());
    store_host_ = before_host;
    store_port_ = before_port;
    return false;
  }
}

void StoreRendezvous::seed_round_after_move(int restarts, int survivors, int quorum) {
  // Every survivor writes the same values; the first one's stand.
  const int round = last_round_ + 1;
  store_->compare_set("round", "", std::to_string(round));
  store_->compare_set(key(round, "restarts"), "", std::to_string(restarts));
  store_->compare_set(key(round, "survivors_expected"), "", std::to_string(survivors));
  if (quorum > 0) store_->compare_set(key(round, "quorum"), "", std::to_string(quorum));
}

bool StoreRendezvous::leave_for_moved_store(Clock::time_point& next_look) {
  // Only an agent that serves a store of its own and was never in a round: a recreated pod 0
  // that came up before the survivors moved the store, alone in the store it serves.
  if (!hosts_store_ || last_round_ >= 0 || config_.rdzv.store_peers.empty()) return false;
  if (Clock::now() < next_look) return false;
  next_look = Clock::now() + kPeerLookEvery;
  if (!find_moved_store()) return false;
  ddp::log::info("closing the store this node served: no node joined it");
  server_.reset();
  agents_server_.reset();
  hosts_store_ = false;
  return true;
}

bool StoreRendezvous::find_moved_store() {
  for (const std::string& peer : config_.rdzv.store_peers) {
    if (peer == store_host_) continue;  // the endpoint: tried as usual
    // A store this agent serves is not one it should move to.
    if (hosts_store_ && names_this_machine(peer, host_, config_.local_addr)) continue;
    if (!ddp::net::probe_tcp(peer, config_.store_port, kPeerProbe).empty()) continue;
    try {
      auto live = ddp::Store::connect(peer, config_.store_port, config_.rdzv.read_timeout,
                                      {config_.rdzv.join_token, ddp::StoreProtocol::kModern})
                      ->with_prefix("ddprun/" + config_.run_id);
      if (!live->check({"round"})) continue;  // another job's store, or one not started yet
      const std::string round = live->get("round");
      const std::string was = store_host_ + ":" + std::to_string(store_port_);
      if (!connect_store_at(peer, Clock::now() + config_.rdzv.read_timeout)) continue;
      ddp::log::info(
          "the job's rendezvous store moved to {}:{} (round {} in progress); joining it there "
          "rather than at {}",
          peer, store_port_, round, was);
      return true;
    } catch (const ddp::JoinRefusedError&) {
      throw;
    } catch (const ddp::StoreError& e) {
      ddp::log::debug("no store of this job at {}:{}: {}", peer, config_.store_port, e.what());
    }
  }
  return false;
}

std::optional<FailureReport> StoreRendezvous::finish(int round, int nodes) {
  store_->add(key(round, "done"), 1);
  const auto deadline = Clock::now() + config_.rdzv.exit_barrier_timeout;
  auto backoff = milliseconds(1);
  while (store_->add(key(round, "done"), 0) < nodes) {
    poll_interrupt_();
    if (auto f = failure(round)) return f;
    if (Clock::now() >= deadline) {
      ddp::log::warn(
          "not every node finished within the exit barrier timeout ({:.0f} s); "
          "exiting anyway",
          seconds_of(config_.rdzv.exit_barrier_timeout));
      break;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, poll_cap(milliseconds(100)));
  }
  store_->add(key(round, "released"), 1);
  if (hosts_store_) {
    const auto release_deadline = Clock::now() + kReleaseWait;
    while (store_->add(key(round, "released"), 0) < nodes && Clock::now() < release_deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  return std::nullopt;
}

void StoreRendezvous::linger_until_settled(int round, int nodes) {
  if (!hosts_store_) return;
  try {
    wait_for_count(round, "settled", nodes, Clock::now() + kReleaseWait);
  } catch (const ddp::StoreError&) {
  }
}

void StoreRendezvous::linger_until_stopped(int round, int nodes) {
  if (!hosts_store_) return;
  try {
    wait_for_count(round, "stopped", nodes,
                   Clock::now() + config_.shutdown_timeout + std::chrono::seconds(5));
  } catch (const ddp::StoreError&) {
  }
}

}  // namespace ddprun
