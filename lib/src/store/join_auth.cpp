#include "store/join_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>

#include "ddp/error.h"

namespace ddp::store::join_auth {
namespace {

constexpr std::size_t kNonceBytes = 16;

std::string hex(const unsigned char* bytes, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

std::string hmac(const std::string& token, std::string_view label, std::string_view first,
                 std::string_view second) {
  std::string message;
  message.reserve(label.size() + first.size() + second.size() + 2);
  message.append(label).append(1, ' ').append(first).append(1, ' ').append(second);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(),
           &length) == nullptr) {
    throw StoreError("rendezvous store: HMAC-SHA256 failed in OpenSSL's libcrypto");
  }
  return hex(digest.data(), length);
}

}  // namespace

std::string nonce() {
  std::array<unsigned char, kNonceBytes> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    throw StoreError(
        "rendezvous store: the system's random generator gave no nonce (OpenSSL "
        "RAND_bytes failed)");
  }
  return hex(bytes.data(), bytes.size());
}

std::string store_proof(const std::string& token, std::string_view agent_nonce,
                        std::string_view store_nonce) {
  return hmac(token, "ddprun-join-v1 store", agent_nonce, store_nonce);
}

std::string agent_proof(const std::string& token, std::string_view store_nonce,
                        std::string_view agent_nonce) {
  return hmac(token, "ddprun-join-v1 agent", store_nonce, agent_nonce);
}

bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool is_nonce(std::string_view text) {
  if (text.size() != 2 * kNonceBytes) return false;
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::optional<Challenge> parse_challenge(std::string_view answer) {
  if (answer.substr(0, kChallenge.size()) != kChallenge) return std::nullopt;
  answer.remove_prefix(kChallenge.size());
  const auto space = answer.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  Challenge c{std::string(answer.substr(0, space)), std::string(answer.substr(space + 1))};
  if (!is_nonce(c.store_nonce)) return std::nullopt;
  return c;
}

}  // namespace ddp::store::join_auth
