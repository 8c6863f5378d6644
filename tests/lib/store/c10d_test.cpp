#include "store/c10d.h"

#include <cstdint>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace ddp::store {
namespace {

TEST(C10dCounter, ReadsALeadingIntegerAsTorchsStollDoes) {
  EXPECT_EQ(counter_value("42"), 42);
  EXPECT_EQ(counter_value("-3"), -3);
  EXPECT_EQ(counter_value("5x"), 5);
  EXPECT_EQ(counter_value(" 7"), 7);
  EXPECT_FALSE(counter_value(""));
  EXPECT_FALSE(counter_value("x5"));
  EXPECT_FALSE(counter_value("99999999999999999999"));
}

TEST(C10dCounter, AddStartsAMissingKeyAtZeroAndWrapsAround) {
  EXPECT_EQ(counter_after_add(nullptr, 3), 3);
  const std::string five = "5";
  EXPECT_EQ(counter_after_add(&five, -7), -2);
  const std::string max = std::to_string(std::numeric_limits<int64_t>::max());
  EXPECT_EQ(counter_after_add(&max, 1), std::numeric_limits<int64_t>::min());
  const std::string text = "abc";
  EXPECT_FALSE(counter_after_add(&text, 1));
}

TEST(C10dCompareSet, AnEmptyExpectationMatchesAMissingKeyOrAnEmptyValue) {
  auto outcome = compare_set(nullptr, "", "new");
  EXPECT_TRUE(outcome.write);
  EXPECT_EQ(outcome.answer, "new");
  const std::string empty;
  outcome = compare_set(&empty, "", "new");
  EXPECT_TRUE(outcome.write);
  EXPECT_EQ(outcome.answer, "new");
}

TEST(C10dCompareSet, AMismatchAnswersExpectedForAMissingKeyElseTheCurrentValue) {
  auto outcome = compare_set(nullptr, "old", "new");
  EXPECT_FALSE(outcome.write);
  EXPECT_EQ(outcome.answer, "old");
  const std::string current = "other";
  outcome = compare_set(&current, "old", "new");
  EXPECT_FALSE(outcome.write);
  EXPECT_EQ(outcome.answer, "other");
  outcome = compare_set(&current, "", "new");
  EXPECT_FALSE(outcome.write);
  EXPECT_EQ(outcome.answer, "other");
  outcome = compare_set(&current, "other", "new");
  EXPECT_TRUE(outcome.write);
  EXPECT_EQ(outcome.answer, "new");
}

}  // namespace
}  // namespace ddp::store
