#include "store/etcd_curl.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <type_traits>
#include <utility>

#include "ddp/error.h"

namespace ddp::detail {
namespace {

long millis_until(HttpPoster::Clock::time_point deadline) {
  using std::chrono::milliseconds;
  const auto left =
      std::chrono::duration_cast<milliseconds>(deadline - HttpPoster::Clock::now()).count();
  return static_cast<long>(std::clamp<long long>(left, 1, 24LL * 3600 * 1000));
}

size_t append_to_string(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

}  // namespace

const CurlApi& curl_api() {
  static std::once_flag once;
  static CurlApi api;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      failure =
          "--rdzv-backend etcd-v2 needs libcurl (libcurl.so.4), which this host lacks: install it "
          "(Debian: libcurl4)";
      return;
    }
    CurlApi found;
    std::string missing;
    const auto resolve = [&](auto& fn, const char* name) {
      void* symbol = dlsym(lib, name);
      if (symbol == nullptr && missing.empty()) missing = name;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(symbol);
    };
    resolve(found.global_init, "curl_global_init");
    resolve(found.easy_init, "curl_easy_init");
    resolve(found.easy_setopt, "curl_easy_setopt");
    resolve(found.easy_perform, "curl_easy_perform");
    resolve(found.easy_getinfo, "curl_easy_getinfo");
    resolve(found.easy_cleanup, "curl_easy_cleanup");
    resolve(found.easy_strerror, "curl_easy_strerror");
    resolve(found.slist_append, "curl_slist_append");
    resolve(found.slist_free_all, "curl_slist_free_all");
    if (!missing.empty()) {
      failure = "the libcurl.so.4 on this host lacks " + missing +
                ": install a libcurl 7.x or newer (Debian: libcurl4)";
      return;
    }
    const CURLcode init = found.global_init(CURL_GLOBAL_DEFAULT);
    if (init != CURLE_OK) {
      failure = std::string("libcurl failed to initialise: ") + found.easy_strerror(init);
      return;
    }
    api = found;
  });
  if (!failure.empty()) throw StoreError(failure);
  return api;
}

HttpPoster::HttpPoster(std::string base_url, bool https, const EtcdOptions& options)
    : api_(curl_api()), base_url_(std::move(base_url)) {
  handle_ = api_.easy_init();
  if (handle_ == nullptr) throw StoreError("libcurl could not create a transfer handle");
  headers_ = api_.slist_append(headers_, "Content-Type: application/json");
  // No "Expect: 100-continue" round trip before a large body.
  headers_ = api_.slist_append(headers_, "Expect:");
  api_.easy_setopt(handle_, CURLOPT_NOSIGNAL, 1L);
  api_.easy_setopt(handle_, CURLOPT_POST, 1L);
  api_.easy_setopt(handle_, CURLOPT_HTTPHEADER, headers_);
  api_.easy_setopt(handle_, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  api_.easy_setopt(handle_, CURLOPT_WRITEFUNCTION, &append_to_string);
  api_.easy_setopt(handle_, CURLOPT_WRITEDATA, &response_);
  api_.easy_setopt(handle_, CURLOPT_ERRORBUFFER, error_.data());
  api_.easy_setopt(handle_, CURLOPT_TCP_KEEPALIVE, 1L);
  // etcd is reached directly: an http_proxy meant for the outside world must not carry it.
  api_.easy_setopt(handle_, CURLOPT_PROXY, "");
  if (https) {
    if (!options.cacert.empty()) api_.easy_setopt(handle_, CURLOPT_CAINFO, options.cacert.c_str());
    if (!options.cert.empty()) api_.easy_setopt(handle_, CURLOPT_SSLCERT, options.cert.c_str());
    if (!options.key.empty()) api_.easy_setopt(handle_, CURLOPT_SSLKEY, options.key.c_str());
  }
}

HttpPoster::~HttpPoster() {
  if (handle_ != nullptr) api_.easy_cleanup(handle_);
  if (headers_ != nullptr) api_.slist_free_all(headers_);
}

HttpReply HttpPoster::post(const std::string& path, const std::string& body,
                           Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  const long left = millis_until(deadline);
  const std::string url = base_url_ + path;
  api_.easy_setopt(handle_, CURLOPT_URL, url.c_str());
  api_.easy_setopt(handle_, CURLOPT_POSTFIELDS, body.c_str());
  api_.easy_setopt(handle_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  api_.easy_setopt(handle_, CURLOPT_TIMEOUT_MS, left);
  api_.easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT_MS, left);
  response_.clear();
  error_[0] = '\0';
  HttpReply reply;
  reply.code = api_.easy_perform(handle_);
  api_.easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &reply.status);
  if (reply.code != CURLE_OK) {
    api_.easy_getinfo(handle_, CURLINFO_OS_ERRNO, &reply.os_errno);
    reply.error = error_.data();
  }
  reply.body = std::move(response_);
  response_.clear();
  return reply;
}

std::string HttpPoster::transport_cause(const HttpReply& reply) const {
  if (reply.code == CURLE_COULDNT_CONNECT && reply.os_errno != 0) {
    std::string text = std::strerror(static_cast<int>(reply.os_errno));
    if (!text.empty()) {
      text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
    }
    return text;
  }
  if (!reply.error.empty()) {
    std::string text = reply.error;
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
      text.pop_back();
    }
    if (!text.empty()) return text;
  }
  return api_.easy_strerror(reply.code);
}

bool HttpPoster::retryable(CURLcode code) {
  return code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST ||
         code == CURLE_OPERATION_TIMEDOUT || code == CURLE_GOT_NOTHING ||
         code == CURLE_RECV_ERROR || code == CURLE_SEND_ERROR;
}

bool HttpPoster::tls_failure(CURLcode code) {
  return code == CURLE_SSL_CONNECT_ERROR || code == CURLE_PEER_FAILED_VERIFICATION ||
         code == CURLE_SSL_CERTPROBLEM || code == CURLE_SSL_CIPHER ||
         code == CURLE_SSL_CACERT_BADFILE || code == CURLE_SSL_ENGINE_NOTFOUND ||
         code == CURLE_SSL_ENGINE_SETFAILED || code == CURLE_USE_SSL_FAILED;
}

}  // namespace ddp::detail
