// dtl/mesh.hpp — defines: MeshDim, MeshLayout (rank arithmetic, no processes), DeviceMesh
// (a layout plus one sub-Comm per dimension and per combination of dimensions).
//
// Ranks arranged on named dimensions, the way Megatron-LM's RankGenerator and PyTorch's
// DeviceMesh do it. Dimensions are listed fastest-varying first; Megatron's order is
// tp, cp, dp, pp (its order string "tp-cp-ep-dp-pp" without ep):
//
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
//
// Worked example (Megatron-LM's initialize_model_parallel docstring): 16 GPUs, tp=2, pp=4, so
// dp=2:  tp groups [0,1] [2,3] ... [14,15];  dp groups [0,2] [1,3] [4,6] [5,7] ...;
// pp groups [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15];
// tp x pp ("model parallel") groups [0,1,4,5,8,9,12,13] [2,3,6,7,10,11,14,15].
// With tp innermost a tp group is a run of consecutive ranks, so it lands inside one node
// (real launchers and the network emulator both put consecutive ranks on one node): tensor
// parallelism, the chattiest, gets the fastest links.
//
//   dtl::DeviceMesh mesh = dtl::DeviceMesh::megatron(rt.world(), /*tp=*/2, /*cp=*/1, /*pp=*/1);
//   mesh.comm("tp").all_reduce(partial);          // my tensor-parallel peers
//   mesh.comm({"dp", "cp"}).all_reduce(grads);    // weight grads: reduced over dp x cp
//
// The mesh is passed explicitly to whatever needs it (Megatron's newer ProcessGroupCollection
// style), never kept in a global.
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtl/comm.hpp"

namespace dtl {

struct MeshDim {
  std::string name;
  int size = 1;
};

// Pure arithmetic over a layout: coordinates, groups, rank lists. No communication, so any
// layout (e.g. 16 GPUs) can be computed and checked on one process.
class MeshLayout {
 public:
  // Dimensions fastest-varying first; names unique and non-empty; sizes >= 1.
  explicit MeshLayout(std::vector<MeshDim> dims);
  // Megatron's order tp, cp, dp, pp over `world` ranks. dp = 0 means "whatever is left":
  // world / (tp x cp x pp), which must divide exactly. Errors name the numbers, e.g.
  // "tp=3 x cp=1 x pp=2 = 6 does not divide world 4".
  static MeshLayout megatron(int world, int tp, int cp = 1, int pp = 1, int dp = 0);

  int world_size() const { return world_size_; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  bool has(const std::string& dim) const;
  int size(const std::string& dim) const;                  // dtl::Error for an unknown name
  int size(const std::vector<std::string>& dims) const;    // product of the sizes
  std::vector<int> coords(int rank) const;                 // one per dim, in dims() order
  int coord(int rank, const std::string& dim) const;
  int rank_of(const std::vector<int>& coords) const;
  // The groups "along" `dims`: ranks that differ only in those coordinates. Each group is
  // listed in increasing rank order; groups are ordered by their first rank.
  std::vector<std::vector<int>> groups(const std::vector<std::string>& dims) const;
  // The group of `rank` along `dims`.
  std::vector<int> group_of(int rank, const std::vector<std::string>& dims) const;
  std::string order() const;     // "tp-cp-dp-pp"
  std::string describe() const;  // "tp=2 x cp=1 x dp=2 x pp=4 (16 ranks)"

 private:
  int index_of(const std::string& dim) const;
  std::vector<MeshDim> dims_;
  int world_size_ = 1;
};

// A layout over the ranks of a Comm, with its sub-Comms. Construction is collective over
// `world` (every rank, same layout): it creates one sub-Comm per dimension with Comm::split,
// in dims() order. A sub-Comm's rank is this rank's coordinate along its dimension.
class DeviceMesh {
 public:
  // world.size() must equal layout.world_size() (the error names both).
  DeviceMesh(Comm& world, MeshLayout layout);
  static DeviceMesh megatron(Comm& world, int tp, int cp = 1, int pp = 1, int dp = 0);

  const MeshLayout& layout() const { return layout_; }
  Comm& world() const { return *world_; }
  int rank() const { return world_->rank(); }
  int size(const std::string& dim) const { return layout_.size(dim); }
  int coord(const std::string& dim) const { return layout_.coord(rank(), dim); }
  // This rank's group (world ranks) along one or several dimensions.
  std::vector<int> group(const std::vector<std::string>& dims) const {
    return layout_.group_of(rank(), dims);
  }

  // The sub-Comm of one dimension (made at construction), named "<world>/<dim>".
  Comm& comm(const std::string& dim);
  // The sub-Comm of several dimensions, e.g. {"dp", "cp"} (Megatron's "dp-cp" group that
  // reduces weight gradients). Made on first use: that first call is COLLECTIVE over the whole
  // world, so every rank must ask for the same combinations in the same order (ask for them
  // right after building the mesh). Members are ordered by world rank.
  Comm& comm(const std::vector<std::string>& dims);
  // comm({"dp", "cp"}): a braced list of names picks this overload (not std::string's
  // iterator-pair constructor).
  Comm& comm(std::initializer_list<std::string> dims) { return comm(std::vector<std::string>(dims)); }

 private:
  std::shared_ptr<Comm> make_group(const std::vector<std::string>& dims);
  std::shared_ptr<Comm> world_;
  MeshLayout layout_;
  std::map<std::string, std::shared_ptr<Comm>> comms_;  // key: dims joined with '-'
};

}  // namespace dtl
