#include "store/etcd_json.h"

#include <optional>
#include <random>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddp {
namespace {

TEST(EtcdBase64, MatchesRfc4648AndRoundTripsAnyBytes) {
  using detail::base64_decode;
  using detail::base64_encode;
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(base64_decode(encoded), std::optional<std::string>(plain));
  }
  EXPECT_EQ(base64_encode(std::string(1, '\0')), "AA==");
  EXPECT_EQ(base64_encode("\xff\xfe\xfd"), "//79");
  EXPECT_EQ(base64_encode("\xfb\xff"), "+/8=");
  std::mt19937 rng(7);
  for (std::size_t length = 0; length < 300; ++length) {
    std::string bytes(length, '\0');
    for (auto& b : bytes) b = static_cast<char>(rng() & 0xFF);
    const std::string encoded = base64_encode(bytes);
    EXPECT_EQ(encoded.size(), (length + 2) / 3 * 4);
    EXPECT_EQ(base64_decode(encoded), std::optional<std::string>(bytes)) << length;
  }
  for (const char* bad :
       {"Zm9", "Zm=v", "Z===", "====", "Zm9v!A==", "=Zm9", "Zg==Zg==", "Zg=", "Zm9v\n"}) {
    EXPECT_FALSE(base64_decode(bad)) << bad;
  }
}

TEST(EtcdJson, AbsentFieldsAreZeroFalseOrEmptyAndIntegersComeAsStrings) {
  const detail::json answer = {{"count", "7"}, {"deleted", 2}, {"succeeded", true}};
  EXPECT_EQ(detail::int_field(answer, "count"), 7);
  EXPECT_EQ(detail::int_field(answer, "deleted"), 2);
  EXPECT_EQ(detail::int_field(answer, "revision"), 0);
  EXPECT_TRUE(detail::bool_field(answer, "succeeded"));
  EXPECT_FALSE(detail::bool_field(answer, "more"));
  EXPECT_EQ(detail::bytes_field(answer, "value"), "");
  EXPECT_THROW(detail::int_field({{"count", "7x"}}, "count"), StoreError);
  EXPECT_THROW(detail::bytes_field({{"value", "Zm9"}}, "value"), StoreError);
}

TEST(EtcdJson, ARangeAnswerGivesItsFirstKeyValue) {
  const detail::json none = {{"header", detail::json::object()}};
  EXPECT_FALSE(detail::first_kv(none).exists);
  const detail::json one = {
      {"kvs", {{{"key", "aw=="}, {"value", detail::base64_encode("v1")}, {"mod_revision", "12"}}}}};
  const detail::Seen seen = detail::first_kv(one);
  EXPECT_TRUE(seen.exists);
  EXPECT_EQ(seen.value, "v1");
  EXPECT_EQ(seen.mod_revision, 12);
}

TEST(EtcdJson, TheGatewaysErrorTextIsFoundOrEmpty) {
  EXPECT_EQ(detail::etcd_message(R"({"error":"etcdserver: too many operations","code":3})"),
            "etcdserver: too many operations");
  EXPECT_EQ(detail::etcd_message(R"({"message":"m","error":"e"})"), "m");
  EXPECT_EQ(detail::etcd_message("<html>Client sent an HTTP request to an HTTPS server"), "");
  EXPECT_EQ(detail::etcd_message(R"({"code":3})"), "");
}

TEST(EtcdJson, ATransactionWithTooFewAnswersIsAStoreError) {
  const detail::json reply = {{"responses", {{{"response_range", {{"count", "1"}}}}}}};
  EXPECT_EQ(detail::int_field(detail::txn_answer(reply, 0, "response_range"), "count"), 1);
  EXPECT_THROW(detail::txn_answer(reply, 1, "response_range"), StoreError);
}

}  // namespace
}  // namespace ddp
