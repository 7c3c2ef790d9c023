// Tests of the course's one splitting rule (dtl/split.hpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtl/harness/checks.hpp"
#include "dtl/split.hpp"

namespace {

using dtl::Range;
using dtl::split_range;

TEST(Split, FirstPartsTakeTheRemainder) {
  EXPECT_EQ(dtl::split_sizes(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(dtl::split_sizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(dtl::split_sizes(0, 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(split_range(10, 4, 2), (Range{6, 8}));
  EXPECT_EQ(split_range(7, 1, 0), (Range{0, 7}));
}

TEST(Split, PartsAreContiguousCoveringAndBalanced) {
  for (int64_t items : {0, 1, 5, 17, 1000, 786433 * 4 + 1})
    for (int64_t parts = 1; parts <= 9; ++parts) {
      int64_t next = 0;
      for (int64_t i = 0; i < parts; ++i) {
        const Range r = split_range(items, parts, i);
        EXPECT_EQ(r.begin, next) << items << " over " << parts << ", part " << i;
        EXPECT_GE(r.size(), items / parts);
        EXPECT_LE(r.size(), items / parts + 1);
        EXPECT_LE(r.size(), split_range(items, parts, 0).size()) << "part 0 is a largest one";
        next = r.end;
      }
      EXPECT_EQ(next, items);
    }
}

TEST(Split, BadArgumentsNameTheConstraint) {
  using dtl::testing::error_of;
  EXPECT_THAT(error_of([] { split_range(-1, 2, 0); }), ::testing::HasSubstr("items=-1"));
  EXPECT_THAT(error_of([] { split_range(4, 0, 0); }), ::testing::HasSubstr("parts=0"));
  EXPECT_THAT(error_of([] { split_range(4, 2, 2); }), ::testing::HasSubstr("index=2"));
}

}  // namespace
