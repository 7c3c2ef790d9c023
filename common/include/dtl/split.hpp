// dtl/split.hpp — defines: Range, split_range, split_sizes.
//
// The course's one rule for dividing N items (rows of a batch, elements of a flat tensor,
// layers, vocabulary entries) among n parts: contiguous, in part order, and when n does not
// divide N the FIRST N mod n parts get one extra item (torch.tensor_split and
// numpy.array_split do the same):
//
//   N = 10, n = 4  ->  [0,3) [3,6) [6,8) [8,10)       sizes 3 3 2 2
//   N =  2, n = 4  ->  [0,1) [1,2) [2,2) [2,2)         sizes 1 1 0 0
//
// Sizes differ by at most one and part 0 is always the largest, so "the largest part" is
// split_range(N, n, 0).size(). Comm::reduce_scatter / all_gather, lab 02's batch shards and
// lab 03's ring chunks all follow it.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "dtl/error.hpp"

namespace dtl {

struct Range {
  int64_t begin = 0;  // first item
  int64_t end = 0;    // one past the last item
  int64_t size() const { return end - begin; }
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
};

// Part `index` of `items` items divided into `parts` parts. Throws dtl::Error naming the
// constraint unless items >= 0, parts >= 1 and 0 <= index < parts.
inline Range split_range(int64_t items, int64_t parts, int64_t index) {
  DTL_CHECK(items >= 0, fmt::format("split_range: items={} must be >= 0", items));
  DTL_CHECK(parts >= 1, fmt::format("split_range: parts={} must be >= 1", parts));
  DTL_CHECK(index >= 0 && index < parts,
            fmt::format("split_range: index={} must be in [0, parts={})", index, parts));
  const int64_t base = items / parts, extra = items % parts;
  const int64_t begin = index * base + std::min(index, extra);
  return Range{begin, begin + base + (index < extra ? 1 : 0)};
}

// The sizes of all `parts` parts, in order.
inline std::vector<int64_t> split_sizes(int64_t items, int64_t parts) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < parts; ++i) sizes.push_back(split_range(items, parts, i).size());
  return sizes;
}

}  // namespace dtl
