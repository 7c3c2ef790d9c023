// Tests of DeviceMesh: the rank arithmetic against Megatron-LM's published layouts (computed
// offline, no processes), and the sub-Comms at the world sizes the test runs with (1-4, 8).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "dtl/harness/checks.hpp"
#include "dtl/mesh.hpp"
#include "dtl/runtime.hpp"

namespace {

using dtl::DeviceMesh;
using dtl::MeshLayout;
using dtl::testing::error_of;
using Groups = std::vector<std::vector<int>>;

// Megatron-LM, initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 -> dp=2.
TEST(MeshLayout, MegatronSixteenGpuExample) {
  const MeshLayout m = MeshLayout::megatron(16, /*tp=*/2, /*cp=*/1, /*pp=*/4);
  EXPECT_EQ(m.size("dp"), 2);
  EXPECT_EQ(m.order(), "tp-cp-dp-pp");
  EXPECT_EQ(m.groups({"tp"}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(m.groups({"pp"}), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(m.groups({"dp"}),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(m.groups({"tp", "pp"}), (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  // The embedding group is the first and last stage of each pipeline.
  const auto pipe = m.group_of(0, {"pp"});
  EXPECT_EQ(pipe.front(), 0);
  EXPECT_EQ(pipe.back(), 12);
}

// Context parallelism (Megatron-LM's CP groups): cp sits between tp and dp in the rank order.
TEST(MeshLayout, MegatronContextParallelGroups) {
  const MeshLayout a = MeshLayout::megatron(8, /*tp=*/4, /*cp=*/2);
  EXPECT_EQ(a.groups({"cp"}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  const MeshLayout b = MeshLayout::megatron(16, /*tp=*/2, /*cp=*/2, /*pp=*/2);  // dp = 2
  EXPECT_EQ(b.group_of(0, {"cp"}), (std::vector<int>{0, 2}));
  EXPECT_EQ(b.group_of(0, {"dp"}), (std::vector<int>{0, 4}));
  EXPECT_EQ(b.group_of(0, {"dp", "cp"}), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(b.group_of(0, {"cp", "dp"}), (std::vector<int>{0, 2, 4, 6}));  // order-free
  EXPECT_EQ(b.group_of(0, {"pp"}), (std::vector<int>{0, 8}));
}

TEST(MeshLayout, CoordinatesRoundTripAndGroupsPartitionTheWorld) {
  const MeshLayout m({{"tp", 3}, {"cp", 1}, {"dp", 2}, {"pp", 2}});
  EXPECT_EQ(m.world_size(), 12);
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(m.rank_of(m.coords(r)), r);
    EXPECT_EQ(r, m.coord(r, "tp") + 3 * (m.coord(r, "dp") + 2 * m.coord(r, "pp")));
  }
  for (const auto& dims : std::vector<std::vector<std::string>>{{"tp"}, {"dp"}, {"pp"}, {"cp"},
                                                               {"dp", "cp"}, {"tp", "pp"}}) {
    std::multiset<int> seen;
    const auto groups = m.groups(dims);
    for (const auto& g : groups) {
      EXPECT_EQ(static_cast<int>(g.size()), m.size(dims));
      EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
      seen.insert(g.begin(), g.end());
    }
    EXPECT_EQ(static_cast<int>(groups.size()) * m.size(dims), 12);
    for (int r = 0; r < 12; ++r) EXPECT_EQ(seen.count(r), 1u) << "rank " << r << " in one group";
  }
  // With tp innermost, a tp group is a run of consecutive ranks (one node).
  for (const auto& g : m.groups({"tp"})) EXPECT_EQ(g.back() - g.front(), 2);
}

TEST(MeshLayout, ErrorsNameTheConstraint) {
  EXPECT_THAT(error_of([] { MeshLayout::megatron(4, 3, 1, 2); }),
              ::testing::HasSubstr("tp=3 x cp=1 x pp=2 = 6 does not divide world 4"));
  EXPECT_THAT(error_of([] { MeshLayout::megatron(8, 2, 1, 2, 4); }),
              ::testing::HasSubstr("= 16 but world is 8"));
  EXPECT_THAT(error_of([] { MeshLayout::megatron(4, 0); }), ::testing::HasSubstr("tp=0 must be >= 1"));
  EXPECT_THAT(error_of([] { MeshLayout({{"tp", 2}, {"tp", 2}}); }), ::testing::HasSubstr("appears twice"));
  EXPECT_THAT(error_of([] { MeshLayout::megatron(4, 2).size("ep"); }), ::testing::HasSubstr("no dimension 'ep'"));
  EXPECT_THAT(error_of([] { MeshLayout::megatron(4, 2).coords(4); }), ::testing::HasSubstr("outside the mesh"));
}

// Every factorisation of the running world: sub-Comms have the layout's members, the rank is
// the coordinate, and a collective on a sub-Comm reaches exactly its group.
TEST(DeviceMesh, SubCommsMatchTheLayoutForEveryFactorisation) {
  dtl::Comm& world = dtl::world();
  const int n = world.size(), r = world.rank();
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp) continue;
    for (int pp = 1; pp * tp <= n; ++pp) {
      if ((n / tp) % pp) continue;
      DeviceMesh mesh = DeviceMesh::megatron(world, tp, 1, pp);
      SCOPED_TRACE(mesh.layout().describe());
      for (const char* dim : {"tp", "cp", "dp", "pp"}) {
        dtl::Comm& c = mesh.comm(dim);
        EXPECT_EQ(c.size(), mesh.size(dim));
        EXPECT_EQ(c.rank(), mesh.coord(dim));
        EXPECT_EQ(c.world_ranks(), mesh.group({dim}));
        EXPECT_EQ(c.name(), world.name() + "/" + dim);
        auto t = torch::full({3}, static_cast<double>(r), torch::kFloat64);
        c.all_reduce(t);
        double sum = 0;
        for (int m : mesh.group({dim})) sum += m;
        DTL_EXPECT_EQUAL(t, torch::full({3}, sum, torch::kFloat64));
      }
      dtl::Comm& dpcp = mesh.comm({"dp", "cp"});
      EXPECT_EQ(&dpcp, &mesh.comm({"cp", "dp"}));  // one group, whatever the order asked
      EXPECT_EQ(dpcp.world_ranks(), mesh.group({"dp", "cp"}));
      dtl::Comm& model = mesh.comm({"tp", "pp"});
      EXPECT_EQ(model.size(), tp * pp);
      model.barrier();
    }
  }
}

TEST(DeviceMesh, WrongWorldSizeIsRejected) {
  dtl::Comm& world = dtl::world();
  const int n = world.size();
  EXPECT_THAT(error_of([&] { DeviceMesh(world, MeshLayout({{"dp", n + 1}})); }),
              ::testing::HasSubstr(fmt::format("needs {} ranks but comm 'world' has {}", n + 1, n)));
}

}  // namespace
