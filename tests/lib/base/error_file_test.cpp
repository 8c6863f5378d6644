#include "ddp/error_file.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ddp/error.h"

namespace ddp {
namespace {

std::string temp_path(const char* name) {
  char dir[] = "/tmp/ddp-error-file-XXXXXX";
  return std::string(mkdtemp(dir)) + "/" + name;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ErrorFile, WritesTorchelasticsFormatWithTheKindOfError) {
  const std::string path = temp_path("error.json");
  setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  EXPECT_TRUE(record_error(TimeoutError("allreduce", 1, 0, "no progress")));
  unsetenv("TORCHELASTIC_ERROR_FILE");
  const auto doc = nlohmann::json::parse(read_text(path), nullptr, false);
  ASSERT_TRUE(doc.is_object()) << read_text(path);
  const std::string message = doc["message"]["message"].get<std::string>();
  EXPECT_EQ(message.rfind("TimeoutError: ", 0), 0u) << message;
  EXPECT_NE(message.find("no progress"), std::string::npos) << message;
  EXPECT_TRUE(doc["message"]["extraInfo"]["timestamp"].is_string());
  std::remove(path.c_str());
  std::remove(path.substr(0, path.rfind('/')).c_str());
}

TEST(ErrorFile, NothingIsWrittenWithoutTheVariableAndFailuresAreReported) {
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_TRUE(record_error(DataError("f", "is corrupt")));
  setenv("TORCHELASTIC_ERROR_FILE", "/nonexistent-dir/error.json", 1);
  EXPECT_FALSE(record_error(std::runtime_error("x")));
  unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(error_kind(std::runtime_error("x")), "std::exception");
  EXPECT_EQ(error_kind(CommError("barrier", 0, 1, "gone")), "CommError");
}

}  // namespace
}  // namespace ddp
