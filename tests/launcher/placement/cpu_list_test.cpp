// The kernel's CPU list format, parsed and written back.
#include "placement/cpu_list.h"

#include <gtest/gtest.h>

#include "ddp/error.h"

namespace ddprun {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_cpu_list(text, "cpuset.cpus.effective");
  } catch (const ddp::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected '" << text << "' to be refused";
  return "";
}

TEST(CpuList, ParsesRangesSinglesAndWhitespace) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11", "x"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5\n", "x"), (std::set<int>{5}));
  EXPECT_EQ(parse_cpu_list("0-0", "x"), (std::set<int>{0}));
  EXPECT_EQ(parse_cpu_list(" 1 , 2-3 \n", "x"), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(parse_cpu_list(",1,,2,", "x"), (std::set<int>{1, 2}));
  EXPECT_EQ(parse_cpu_list("3,1-2,2", "x"), (std::set<int>{1, 2, 3}));
  EXPECT_EQ(parse_cpu_list("65535", "x"), (std::set<int>{65535}));
}

TEST(CpuList, AnEmptyListIsNoCpu) {
  EXPECT_TRUE(parse_cpu_list("", "x").empty());
  EXPECT_TRUE(parse_cpu_list("\n", "x").empty());
  EXPECT_TRUE(parse_cpu_list(" , ", "x").empty());
}

TEST(CpuList, RefusesWhatIsNotAListNamingTheSource) {
  EXPECT_EQ(error_of("3-1"),
            "cpuset.cpus.effective: '3-1' is not a CPU list ('3-1' runs backwards; write the "
            "lower CPU first)");
  for (const char* bad : {"a", "1-", "-1", "1-2-3", "0x1", "2,b", "65536", "99999999", "1.5"}) {
    const std::string message = error_of(bad);
    EXPECT_EQ(message.rfind("cpuset.cpus.effective: '", 0), 0u) << bad << ": " << message;
    EXPECT_NE(message.find("is not a CPU list"), std::string::npos) << bad << ": " << message;
  }
}

TEST(CpuList, FormatsRunsAsRanges) {
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({7}), "7");
  EXPECT_EQ(format_cpu_list({0, 1}), "0-1");
  EXPECT_EQ(format_cpu_list({0, 2, 4}), "0,2,4");
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  for (const char* text : {"0-3,8,10-11", "1,3,5", "0-95", "4-7,100-103"}) {
    EXPECT_EQ(format_cpu_list(parse_cpu_list(text, "x")), text);
  }
}

}  // namespace
}  // namespace ddprun
