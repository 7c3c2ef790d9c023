// The NCCL backend's checks that need no GPU: run in CI (ctest common.nccl_no_device.n1) on a
// machine without one, and on GPU machines alike. The messages are the ones a GPU run gives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dtl/comm_nccl.hpp"
#include "dtl/harness/checks.hpp"
#include "dtl/runtime.hpp"

namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using dtl::testing::error_of;

TEST(NcclNoDevice, RanksSharingAGpuAreNamedByUuid) {
  // Per-rank binding: every rank sees one GPU, as cuda:0, but they are different GPUs.
  EXPECT_EQ(error_of([] { dtl::nccl_check_distinct_gpus({"GPU-a", "GPU-b", "GPU-c"}, 3); }),
            "(no dtl::Error)");
  EXPECT_THAT(error_of([] { dtl::nccl_check_distinct_gpus({"GPU-a", "GPU-b", "GPU-a"}, 3); }),
              AllOf(HasSubstr("ranks 0 and 2 both use GPU GPU-a"), HasSubstr("3 ranks on this node"),
                    HasSubstr("one GPU per rank")));
}

TEST(NcclNoDevice, TagsAreRejectedClearly) {
  EXPECT_EQ(error_of([] { dtl::nccl_check_p2p_tag(0, "send"); }), "(no dtl::Error)");
  EXPECT_THAT(error_of([] { dtl::nccl_check_p2p_tag(7, "recv"); }),
              AllOf(HasSubstr("recv: tag 7 is not supported by the nccl backend"),
                    HasSubstr("use tag 0")));
}

TEST(NcclNoDevice, VersionStringNamesRuntimeAndHeader) {
  std::string v = dtl::nccl_version_string();
  if (dtl::nccl_compiled()) {
    EXPECT_THAT(v, ::testing::MatchesRegex("2\\.[0-9]+\\.[0-9]+ \\(built with 2\\.[0-9]+\\.[0-9]+\\)"));
  } else {
    EXPECT_THAT(v, HasSubstr("built without NCCL"));
  }
}

TEST(NcclNoDevice, CreatingACommWithoutAGpuSaysWhy) {
  if (error_of([] { dtl::cuda_device_count(); }) == "(no dtl::Error)")
    GTEST_SKIP() << "a CUDA device is present";
  auto& cpu = dtl::Runtime::get().cpu_world();
  for (auto msg : {error_of([&] { dtl::make_nccl_comm(cpu, 0, "x"); }),
                   error_of([&] { dtl::make_nccl_comm(cpu, 0, "x", 1); })})
    EXPECT_THAT(msg, AnyOf(HasSubstr("no usable CUDA device"), HasSubstr("no CUDA device found"),
                           HasSubstr("no NCCL backend")));
}

}  // namespace
