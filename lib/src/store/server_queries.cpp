// The store server's keys and its queries: one handler per query of the c10d protocol, with
// torch's semantics (store/c10d.h for the answers that depend on a key's value). The sockets and
// the event loop are server.cpp's.
#include <algorithm>
#include <cstring>
#include <utility>

#include "ddp/error.h"
#include "ddp/log.h"
#include "store/c10d.h"
#include "store/join_auth.h"
#include "store/server_impl.h"
#include "store/wire.h"

namespace ddp {
namespace {

using store::Dialect;
using store::Op;
using store::ProtocolError;
using store::Query;
using store::Reader;
using store::Served;
using store::Writer;

// The dialect a connection speaks, from its first bytes; nullopt until enough have arrived.
std::optional<Dialect> dialect_of(std::string_view in) {
  if (in[0] != 0) return Dialect::kLegacy;
  if (in.size() < 5) return std::nullopt;
  uint32_t magic = 0;
  std::memcpy(&magic, in.data() + 1, 4);
  return magic == store::kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
}

// A query's list of keys (CHECK, WAIT, MULTI_GET): false when not all there yet.
bool read_keys(Reader& r, std::vector<std::string>& keys) {
  uint64_t n = 0;
  if (!r.count(n)) return false;
  keys.resize(static_cast<std::size_t>(n));
  return std::all_of(keys.begin(), keys.end(), [&](std::string& k) { return r.key(k); });
}

static_assert(std::string_view(store::kJoinKey) == std::string_view(StoreServer::kJoinKey));

}  // namespace

std::size_t StoreServer::Impl::serve_one(uint64_t id, Connection& c) {
  const std::string_view in = std::string_view(c.in).substr(c.in_pos);
  if (in.empty()) return 0;
  if (!c.dialect && !(c.dialect = dialect_of(in))) return 0;
  Reader r(in, c.admitted ? limits : unadmitted_limits);
  uint8_t byte = 0;
  r.u8(byte);
  const auto op = store::decode_op(*c.dialect, byte);
  if (!op) {
    throw ProtocolError("unknown query byte " + std::to_string(byte) + " in PyTorch's " +
                        store::dialect_name(*c.dialect) +
                        " store protocol (a PyTorch newer than this ddprun, or not a c10d "
                        "client; upgrade ddprun if it is PyTorch)");
  }
  if (!c.admitted && !open_before_admission(*op)) return refuse(c, *op, in.size());
  Writer out;
  Query q{id, c, *op, r, out};
  switch ((this->*handler_for(*op))(q)) {
    case Served::kIncomplete:
      c.need = c.in_pos + r.needed();
      return 0;
    case Served::kRefused:
      return refuse(c, *op, in.size());
    case Served::kDone:
      break;
  }
  if (!out.data().empty()) send(id, c, std::move(out.data()));
  return r.consumed();
}

bool StoreServer::Impl::open_before_admission(Op op) {
  // COMPARE_SET: only on the join key (its handler refuses the others).
  return op == Op::kValidate || op == Op::kPing || op == Op::kNumKeys || op == Op::kCompareSet;
}

StoreServer::Impl::Handler StoreServer::Impl::handler_for(Op op) {
  switch (op) {
    case Op::kValidate:
      return &Impl::on_validate;
    case Op::kSet:
      return &Impl::on_set;
    case Op::kCompareSet:
      return &Impl::on_compare_set;
    case Op::kGet:
      return &Impl::on_get;
    case Op::kAdd:
      return &Impl::on_add;
    case Op::kCheck:
      return &Impl::on_check;
    case Op::kWait:
      return &Impl::on_wait;
    case Op::kNumKeys:
      return &Impl::on_num_keys;
    case Op::kWatchKey:
      return &Impl::on_watch_key;
    case Op::kDeleteKey:
      return &Impl::on_delete_key;
    case Op::kAppend:
      return &Impl::on_append;
    case Op::kMultiGet:
      return &Impl::on_multi_get;
    case Op::kMultiSet:
      return &Impl::on_multi_set;
    case Op::kCancelWait:
      return &Impl::on_cancel_wait;
    case Op::kPing:
      return &Impl::on_ping;
    case Op::kQueuePush:
      return &Impl::on_queue_push;
    case Op::kQueuePop:
      return &Impl::on_queue_pop;
    case Op::kQueueLen:
      return &Impl::on_queue_len;
    case Op::kListKeys:
      return &Impl::on_list_keys;
    case Op::kBarrier:
      return &Impl::on_barrier;
  }
  throw ProtocolError("a query this server has no handler for");
}

// ---- The handshake: open before the join token --------------------------------------------

Served StoreServer::Impl::on_validate(Query& q) {
  uint32_t magic = 0;
  if (!q.r.value(magic)) return Served::kIncomplete;
  if (magic != store::kValidationMagic) throw ProtocolError("a wrong validation number");
  return Served::kDone;
}

Served StoreServer::Impl::on_ping(Query& q) {
  uint32_t nonce = 0;
  if (!q.r.value(nonce)) return Served::kIncomplete;
  q.out.value(nonce);
  return Served::kDone;
}

Served StoreServer::Impl::on_num_keys(Query& q) {
  q.out.value<int64_t>(static_cast<int64_t>(data.size()));
  return Served::kDone;
}

// 2.10's list_keys: every key's full name (clients keep those under their prefix), in no order
// torch promises; here sorted. Queues are not keys, as in torch's servers.
Served StoreServer::Impl::on_list_keys(Query& q) {
  std::vector<const std::string*> keys;
  keys.reserve(data.size());
  for (const auto& entry : data) keys.push_back(&entry.first);
  std::sort(keys.begin(), keys.end(), [](const auto* a, const auto* b) { return *a < *b; });
  q.out.value<int64_t>(static_cast<int64_t>(keys.size()));
  for (const std::string* key : keys) q.out.bytes(*key);
  return Served::kDone;
}

Served StoreServer::Impl::on_compare_set(Query& q) {
  std::string key, expected, desired;
  if (!q.r.key(key)) return Served::kIncomplete;
  // Refused before the values are read: they may be large.
  if (!q.c.admitted && key != store::kJoinKey) return Served::kRefused;
  if (!q.r.payload(expected) || !q.r.payload(desired)) return Served::kIncomplete;
  if (key == store::kJoinKey) {
    q.out.bytes(join(q.c, expected));
    return Served::kDone;
  }
  auto pos = data.find(key);
  const auto outcome =
      store::compare_set(pos == data.end() ? nullptr : &pos->second, expected, desired);
  q.out.bytes(outcome.answer);
  if (outcome.write) put(key, std::move(desired));
  return Served::kDone;
}

// ---- Keys ---------------------------------------------------------------------------------

Served StoreServer::Impl::on_set(Query& q) {
  std::string key, value;
  if (!q.r.key(key) || !q.r.payload(value)) return Served::kIncomplete;
  put(key, std::move(value));
  return Served::kDone;
}

Served StoreServer::Impl::on_get(Query& q) {
  std::string key;
  if (!q.r.key(key)) return Served::kIncomplete;
  q.out.bytes(value_of(key));
  return Served::kDone;
}

Served StoreServer::Impl::on_add(Query& q) {
  std::string key;
  int64_t delta = 0;
  if (!q.r.key(key) || !q.r.value(delta)) return Served::kIncomplete;
  auto pos = data.find(key);
  const auto value = store::counter_after_add(pos == data.end() ? nullptr : &pos->second, delta);
  if (!value) throw ProtocolError("ADD on key '" + key + "', whose value is not an integer");
  put(key, std::to_string(*value));
  q.out.value<int64_t>(*value);
  return Served::kDone;
}

Served StoreServer::Impl::on_check(Query& q) {
  std::vector<std::string> keys;
  if (!read_keys(q.r, keys)) return Served::kIncomplete;
  q.out.u8(keys_present(keys) ? store::kCheckReady : store::kCheckNotReady);
  return Served::kDone;
}

Served StoreServer::Impl::on_wait(Query& q) {
  std::vector<std::string> keys;
  if (!read_keys(q.r, keys)) return Served::kIncomplete;
  if (keys_present(keys)) {
    q.out.u8(store::kStopWaiting);
    return Served::kDone;
  }
  clear_wait(q.id, q.c);
  for (const auto& k : keys) {
    if (data.count(k) != 0) continue;
    waiting[k].push_back(q.id);
    q.c.awaited_keys.push_back(k);
    ++q.c.awaited;
  }
  return Served::kDone;
}

Served StoreServer::Impl::on_multi_get(Query& q) {
  std::vector<std::string> keys;
  if (!read_keys(q.r, keys)) return Served::kIncomplete;
  std::vector<std::string_view> values;
  values.reserve(keys.size());
  std::size_t size = 0;
  for (const auto& k : keys) {
    values.push_back(value_of(k));
    size += 8 + values.back().size();
  }
  if (size > options.max_request_bytes) {
    throw ProtocolError("a MULTI_GET whose answer would be " + std::to_string(size) +
                        " bytes (the limit is " + std::to_string(options.max_request_bytes) + ")");
  }
  for (const auto v : values) q.out.bytes(v);
  return Served::kDone;
}

Served StoreServer::Impl::on_delete_key(Query& q) {
  std::string key;
  if (!q.r.key(key)) return Served::kIncomplete;
  auto pos = data.find(key);
  if (pos == data.end()) {
    q.out.value<int64_t>(0);
    return Served::kDone;
  }
  const std::string old = std::move(pos->second);
  data.erase(pos);
  if (auto w = watchers.find(key); w != watchers.end()) {
    Writer msg;
    msg.u8(store::kWatchKeyDeleted).bytes(key).bytes(old).bytes("");
    for (uint64_t wid : w->second) {
      if (auto wc = conns.find(wid); wc != conns.end()) send(wid, wc->second, msg.data());
    }
  }
  q.out.value<int64_t>(1);
  return Served::kDone;
}

Served StoreServer::Impl::on_append(Query& q) {
  std::string key, tail;
  if (!q.r.key(key) || !q.r.payload(tail)) return Served::kIncomplete;
  auto pos = data.find(key);
  const bool created = pos == data.end();
  if (created) {
    data[key] = tail;
  } else if (pos->second.size() + tail.size() > limits.max_value) {
    throw ProtocolError("APPEND would grow key '" + key + "' beyond the value limit of " +
                        std::to_string(limits.max_value) + " bytes");
  } else {
    pos->second += tail;
  }
  changed(key, created ? store::kWatchKeyCreated : store::kWatchKeyAppended, "", tail);
  return Served::kDone;
}

Served StoreServer::Impl::on_multi_set(Query& q) {
  uint64_t n = 0;
  if (!q.r.count(n)) return Served::kIncomplete;
  std::vector<std::pair<std::string, std::string>> kvs(static_cast<std::size_t>(n));
  for (auto& [k, v] : kvs) {
    if (!q.r.key(k) || !q.r.payload(v)) return Served::kIncomplete;
  }
  for (auto& [k, v] : kvs) put(k, std::move(v));
  return Served::kDone;
}

Served StoreServer::Impl::on_cancel_wait(Query& q) {
  clear_wait(q.id, q.c);
  q.out.u8(store::kWaitCanceled);
  return Served::kDone;
}

Served StoreServer::Impl::on_watch_key(Query& q) {
  std::string key;
  if (!q.r.key(key)) return Served::kIncomplete;
  watchers[key].push_back(q.id);
  q.c.watched_keys.push_back(key);
  q.out.u8(store::kWatchCallbackRegistered);
  return Served::kDone;
}

// ---- Queues (2.1+) ------------------------------------------------------------------------

Served StoreServer::Impl::on_queue_push(Query& q) {
  std::string key, value;
  if (!q.r.key(key) || !q.r.payload(value)) return Served::kIncomplete;
  queues[key].push_back(std::move(value));
  wake_one(key);
  return Served::kDone;
}

Served StoreServer::Impl::on_queue_pop(Query& q) {
  std::string key;
  if (!q.r.key(key)) return Served::kIncomplete;
  auto queue = queues.find(key);
  const int64_t size = queue == queues.end() ? 0 : static_cast<int64_t>(queue->second.size());
  q.out.value<int64_t>(size);
  if (size > 0) {
    q.out.bytes(queue->second.front());
    queue->second.pop_front();
    if (queue->second.empty()) queues.erase(queue);
  }
  return Served::kDone;
}

Served StoreServer::Impl::on_queue_len(Query& q) {
  std::string key;
  if (!q.r.key(key)) return Served::kIncomplete;
  auto queue = queues.find(key);
  q.out.value<int64_t>(queue == queues.end() ? 0 : static_cast<int64_t>(queue->second.size()));
  return Served::kDone;
}

// ---- BARRIER (PyTorch main, after 2.10's LIST_KEYS) -----------------------------------------

// Adds one to the counter at `key`; the arrival that brings it to `world_size` is answered
// STOP_WAITING at once and wakes every earlier arrival (and any WAIT on the key); earlier ones
// wait. As torch's servers do, the count below the world size is stored without waking anyone.
Served StoreServer::Impl::on_barrier(Query& q) {
  std::string key;
  int64_t world_size = 0;
  if (!q.r.key(key) || !q.r.value(world_size)) return Served::kIncomplete;
  auto pos = data.find(key);
  const auto count = store::counter_after_add(pos == data.end() ? nullptr : &pos->second, 1);
  if (!count) throw ProtocolError("BARRIER on key '" + key + "', whose value is not an integer");
  if (*count >= world_size) {
    put(key, std::to_string(*count));
    q.out.u8(store::kStopWaiting);
    return Served::kDone;
  }
  data[key] = std::to_string(*count);
  clear_wait(q.id, q.c);
  waiting[key].push_back(q.id);
  q.c.awaited_keys.push_back(key);
  q.c.awaited = 1;
  return Served::kDone;
}

// ---- What the handlers share --------------------------------------------------------------

bool StoreServer::Impl::keys_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
    if (data.count(k) != 0) return true;
    auto q = queues.find(k);
    return q != queues.end() && !q->second.empty();
  });
}

void StoreServer::Impl::put(const std::string& key, std::string value) {
  auto pos = data.find(key);
  if (pos == data.end()) {
    const std::string& stored = data[key] = std::move(value);
    changed(key, store::kWatchKeyCreated, "", stored);
  } else {
    std::string old = std::exchange(pos->second, std::move(value));
    changed(key, store::kWatchKeyUpdated, old, pos->second);
  }
}

std::string_view StoreServer::Impl::value_of(const std::string& key) const {
  auto pos = data.find(key);
  return pos == data.end() ? std::string_view() : std::string_view(pos->second);
}

// A key was created or changed: wake its waiters, tell its watchers (1.13's watchKey).
void StoreServer::Impl::changed(const std::string& key, uint8_t watch_type,
                                const std::string& old_value, const std::string& new_value) {
  if (auto w = waiting.find(key); w != waiting.end()) {
    std::vector<uint64_t> ids = std::move(w->second);
    waiting.erase(w);
    for (uint64_t id : ids) {
      auto c = conns.find(id);
      if (c == conns.end() || c->second.awaited == 0) continue;
      if (--c->second.awaited == 0) {
        c->second.awaited_keys.clear();
        send(id, c->second, std::string(1, static_cast<char>(store::kStopWaiting)));
      }
    }
  }
  if (auto w = watchers.find(key); w != watchers.end()) {
    Writer msg;
    msg.u8(watch_type).bytes(key).bytes(old_value).bytes(new_value);
    for (uint64_t id : w->second) {
      if (auto c = conns.find(id); c != conns.end()) send(id, c->second, msg.data());
    }
  }
}

// QUEUE_PUSH wakes one waiter of the queue, as torch does: the first one that waits for no other
// key; waiters for more keys in front of it have this one counted.
void StoreServer::Impl::wake_one(const std::string& key) {
  auto w = waiting.find(key);
  while (w != waiting.end() && !w->second.empty()) {
    const uint64_t id = w->second.front();
    w->second.erase(w->second.begin());
    auto c = conns.find(id);
    if (c == conns.end() || c->second.awaited == 0) continue;
    if (--c->second.awaited == 0) {
      if (w->second.empty()) waiting.erase(w);
      clear_wait(id, c->second);
      send(id, c->second, std::string(1, static_cast<char>(store::kStopWaiting)));
      return;
    }
  }
  if (w != waiting.end()) waiting.erase(w);
}

namespace {
namespace ja = store::join_auth;
constexpr const char* kWrongToken =
    "wrong join token; give every agent of the job the same --rdzv-conf token_file";
}  // namespace

std::string StoreServer::Impl::join(Connection& c, const std::string& presented) {
  if (options.join_token.empty()) return "open";
  const std::string_view text(presented);
  if (text.substr(0, ja::kHello.size()) == ja::kHello) {
    return challenge(c, text.substr(ja::kHello.size()));
  }
  if (text.substr(0, ja::kProof.size()) == ja::kProof) {
    return check_proof(c, text.substr(ja::kProof.size()));
  }
  if (presented.empty()) {
    return refuse_join(c,
                       "this job requires a join token (--rdzv-conf token_file or "
                       "DDPRUN_RDZV_TOKEN_FILE)");
  }
  // An older ddprun sends the token itself; this store never takes it so, right or wrong.
  return refuse_join(c,
                     "the agent sent its join token in clear, as an older ddprun does; this "
                     "store admits agents only by challenge-response: run one ddprun version on "
                     "every node");
}

std::string StoreServer::Impl::challenge(Connection& c, std::string_view agent_nonce) {
  if (!c.store_nonce.empty() || c.agent) {
    return refuse_join(c, "a second join handshake on one connection");
  }
  if (!ja::is_nonce(agent_nonce)) return refuse_join(c, "a malformed join handshake (its nonce)");
  c.agent_nonce = agent_nonce;
  c.store_nonce = ja::nonce();
  return std::string(ja::kChallenge) + c.store_nonce + " " +
         ja::store_proof(options.join_token, c.agent_nonce, c.store_nonce);
}

std::string StoreServer::Impl::check_proof(Connection& c, std::string_view proof) {
  if (c.store_nonce.empty()) return refuse_join(c, "a join proof without a challenge");
  const std::string expected = ja::agent_proof(options.join_token, c.store_nonce, c.agent_nonce);
  // One attempt per challenge: the nonces are spent whatever the outcome.
  c.store_nonce.clear();
  c.agent_nonce.clear();
  if (!ja::same(proof, expected)) return refuse_join(c, kWrongToken);
  c.agent = true;
  c.admitted = true;
  ++agent_ips[c.peer_ip];
  ++agents;
  return "ok " + c.peer_ip;
}

std::string StoreServer::Impl::refuse_join(Connection& c, const std::string& why) {
  ++refused;
  ddp::log::warn("rendezvous store: refused {}: {}", c.peer, why);
  c.closing = true;
  return "refused: " + why;
}

std::size_t StoreServer::Impl::refuse(Connection& c, Op op, std::size_t unread) {
  ++refused;
  ddp::log::warn(
      "rendezvous store: refused {} from {}: the address is not a member of this job and "
      "presented no join token (agents join with --rdzv-conf token_file)",
      store::op_name(op), c.peer);
  c.closing = true;
  return unread;
}

}  // namespace ddp
