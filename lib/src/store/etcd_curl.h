#pragma once
// libcurl for the etcd backend, loaded at run time (dlopen of libcurl.so.4), not linked, so that
// ddprun needs nothing but glibc where the etcd backend is not used; and one kept-alive HTTP/1.1
// connection that POSTs JSON to etcd's gateway.
#include <array>
#include <chrono>
#include <mutex>
#include <string>

// Types and constants only: the functions are resolved with dlsym (see CurlApi).
#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>

#include "ddp/store.h"

namespace ddp::detail {

struct CurlApi {
  CURLcode (*global_init)(long) = nullptr;
  CURL* (*easy_init)() = nullptr;
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...) = nullptr;
  CURLcode (*easy_perform)(CURL*) = nullptr;
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...) = nullptr;
  void (*easy_cleanup)(CURL*) = nullptr;
  const char* (*easy_strerror)(CURLcode) = nullptr;
  curl_slist* (*slist_append)(curl_slist*, const char*) = nullptr;
  void (*slist_free_all)(curl_slist*) = nullptr;
};

// libcurl's functions, resolved once (the library stays loaded for the life of the process);
// throws a StoreError that says how to install it when this host lacks it.
const CurlApi& curl_api();

// One transfer's outcome, before any judgement.
struct HttpReply {
  CURLcode code = CURLE_OK;
  long status = 0;
  long os_errno = 0;
  std::string error;  // libcurl's message for a failed transfer
  std::string body;
};

// POSTs JSON bodies to `base_url` (scheme://host:port) over one connection, one at a time.
class HttpPoster {
 public:
  using Clock = std::chrono::steady_clock;

  // With https, the TLS files of `options` (cacert, cert, key) that are set.
  HttpPoster(std::string base_url, bool https, const EtcdOptions& options);
  ~HttpPoster();
  HttpPoster(const HttpPoster&) = delete;
  HttpPoster& operator=(const HttpPoster&) = delete;

  HttpReply post(const std::string& path, const std::string& body, Clock::time_point deadline);
  // Why a transfer failed, in a few words ("connection refused").
  std::string transport_cause(const HttpReply& reply) const;
  // Failures that waiting may cure: nothing listens yet, its name does not resolve yet, or it
  // does not answer yet.
  static bool retryable(CURLcode code);
  static bool tls_failure(CURLcode code);

 private:
  const CurlApi& api_;
  std::string base_url_;
  std::mutex mu_;  // guards the handle and what it writes into
  CURL* handle_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string response_;
  std::array<char, CURL_ERROR_SIZE + 1> error_{};
};

}  // namespace ddp::detail
