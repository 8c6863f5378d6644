#pragma once
// How an agent proves it holds the job's join token without sending it: a challenge–response
// over HMAC-SHA256 (OpenSSL's libcrypto), in two COMPARE_SETs on kJoinKey (wire.h), each
// answered in the same request:
//
//   agent -> store   "ddprun-join-v1 hello <agent nonce>"
//   store -> agent   "challenge <store nonce> <HMAC(token, store-proof | agent nonce | store
//   nonce)>" agent -> store   "ddprun-join-v1 proof <HMAC(token, agent-proof | store nonce | agent
//   nonce)>" store -> agent   "ok <the agent's address, as the store sees it>" or "refused: <why>"
//
// Nonces are 16 random bytes (hex), fresh per connection on both sides, so nothing that crosses
// the network can be replayed: a proof answers one store nonce, which the store forgets when the
// connection closes, and a recorded store answer proves nothing to an agent with another nonce.
// The store proves the token too, so an agent that reached another job's store (or anything else
// listening there) learns it before it writes a key. The token itself never leaves the host.
// An agent without a token presents "" in clear, which a store with a token refuses.
#include <optional>
#include <string>
#include <string_view>

namespace ddp::store::join_auth {

inline constexpr std::string_view kHello = "ddprun-join-v1 hello ";
inline constexpr std::string_view kProof = "ddprun-join-v1 proof ";
inline constexpr std::string_view kChallenge = "challenge ";

// 16 random bytes from the system's generator (OpenSSL's RAND_bytes), as 32 hex digits.
std::string nonce();
// The store's proof, for the agent to check, and the agent's, for the store to check (64 hex
// digits each). Distinct labels: neither can stand for the other.
std::string store_proof(const std::string& token, std::string_view agent_nonce,
                        std::string_view store_nonce);
std::string agent_proof(const std::string& token, std::string_view store_nonce,
                        std::string_view agent_nonce);
// Compares in time that depends only on the lengths.
bool same(std::string_view a, std::string_view b);
// Whether `text` is a nonce: exactly 32 lowercase hex digits.
bool is_nonce(std::string_view text);

// The store's answer to a hello, split; nullopt when it is not a challenge.
struct Challenge {
  std::string store_nonce;
  std::string proof;
};
std::optional<Challenge> parse_challenge(std::string_view answer);

}  // namespace ddp::store::join_auth
