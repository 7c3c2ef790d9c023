// DeviceMesh: rank arithmetic of named dimensions and the sub-Comms built from it.
#include "dtl/mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "dtl/error.hpp"

namespace dtl {

namespace {
std::string join(const std::vector<std::string>& names, const char* sep) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : sep) + n;
  return out;
}
}  // namespace

MeshLayout::MeshLayout(std::vector<MeshDim> dims) : dims_(std::move(dims)) {
  DTL_CHECK(!dims_.empty(), "DeviceMesh: a mesh needs at least one dimension");
  std::set<std::string> seen;
  world_size_ = 1;
  for (const auto& d : dims_) {
    DTL_CHECK(!d.name.empty(), "DeviceMesh: a dimension needs a name");
    DTL_CHECK(seen.insert(d.name).second,
              fmt::format("DeviceMesh: dimension '{}' appears twice in {}", d.name, order()));
    DTL_CHECK(d.size >= 1, fmt::format("DeviceMesh: {}={} must be >= 1", d.name, d.size));
    world_size_ *= d.size;
  }
}

MeshLayout MeshLayout::megatron(int world, int tp, int cp, int pp, int dp) {
  DTL_CHECK(world >= 1, fmt::format("DeviceMesh: world={} must be >= 1", world));
  for (auto [name, v] : {std::pair<const char*, int>{"tp", tp}, {"cp", cp}, {"pp", pp}})
    DTL_CHECK(v >= 1, fmt::format("DeviceMesh: {}={} must be >= 1", name, v));
  const int model = tp * cp * pp;
  if (dp == 0) {
    DTL_CHECK(world % model == 0,
              fmt::format("DeviceMesh: tp={} x cp={} x pp={} = {} does not divide world {}", tp,
                          cp, pp, model, world));
    dp = world / model;
  }
  DTL_CHECK(dp >= 1, fmt::format("DeviceMesh: dp={} must be >= 1", dp));
  DTL_CHECK(model * dp == world,
            fmt::format("DeviceMesh: tp={} x cp={} x dp={} x pp={} = {} but world is {}", tp, cp,
                        dp, pp, model * dp, world));
  return MeshLayout({{"tp", tp}, {"cp", cp}, {"dp", dp}, {"pp", pp}});
}

int MeshLayout::index_of(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return static_cast<int>(i);
  throw Error(fmt::format("DeviceMesh: no dimension '{}' in {}", dim, describe()));
}

bool MeshLayout::has(const std::string& dim) const {
  return std::any_of(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == dim; });
}
int MeshLayout::size(const std::string& dim) const { return dims_[index_of(dim)].size; }
int MeshLayout::size(const std::vector<std::string>& dims) const {
  int n = 1;
  for (const auto& d : dims) n *= size(d);
  return n;
}

std::vector<int> MeshLayout::coords(int rank) const {
  DTL_CHECK(rank >= 0 && rank < world_size_,
            fmt::format("DeviceMesh: rank {} is outside the mesh of {} ranks", rank, world_size_));
  std::vector<int> c;
  for (const auto& d : dims_) {  // mixed radix, first dimension least significant
    c.push_back(rank % d.size);
    rank /= d.size;
  }
  return c;
}

int MeshLayout::coord(int rank, const std::string& dim) const { return coords(rank)[index_of(dim)]; }

int MeshLayout::rank_of(const std::vector<int>& c) const {
  DTL_CHECK(c.size() == dims_.size(),
            fmt::format("DeviceMesh: {} coordinates given for {} dimensions", c.size(), dims_.size()));
  int rank = 0;
  for (size_t i = dims_.size(); i-- > 0;) {
    DTL_CHECK(c[i] >= 0 && c[i] < dims_[i].size,
              fmt::format("DeviceMesh: {} coordinate {} is outside [0, {})", dims_[i].name, c[i],
                          dims_[i].size));
    rank = rank * dims_[i].size + c[i];
  }
  return rank;
}

std::vector<std::vector<int>> MeshLayout::groups(const std::vector<std::string>& dims) const {
  std::vector<bool> along(dims_.size(), false);
  for (const auto& d : dims) along[index_of(d)] = true;
  // Ranks with equal coordinates outside `dims` form one group; key them by their first rank.
  std::map<int, std::vector<int>> by_first;
  for (int r = 0; r < world_size_; ++r) {
    auto c = coords(r);
    for (size_t i = 0; i < c.size(); ++i)
      if (along[i]) c[i] = 0;
    by_first[rank_of(c)].push_back(r);
  }
  std::vector<std::vector<int>> out;
  for (auto& [first, members] : by_first) out.push_back(std::move(members));
  return out;
}

std::vector<int> MeshLayout::group_of(int rank, const std::vector<std::string>& dims) const {
  for (auto& g : groups(dims))
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  throw Error(fmt::format("DeviceMesh: rank {} is outside the mesh of {} ranks", rank, world_size_));
}

std::string MeshLayout::order() const {
  std::vector<std::string> names;
  for (const auto& d : dims_) names.push_back(d.name);
  return join(names, "-");
}

std::string MeshLayout::describe() const {
  std::string out;
  for (const auto& d : dims_) out += fmt::format("{}{}={}", out.empty() ? "" : " x ", d.name, d.size);
  return fmt::format("{} ({} ranks)", out, world_size_);
}

// ---------------------------------------------------------------- DeviceMesh

DeviceMesh::DeviceMesh(Comm& world, MeshLayout layout)
    : world_(world.shared_from_this()), layout_(std::move(layout)) {
  DTL_CHECK(world.size() == layout_.world_size(),
            fmt::format("DeviceMesh: {} needs {} ranks but comm '{}' has {}", layout_.describe(),
                        layout_.world_size(), world.name(), world.size()));
  for (const auto& d : layout_.dims()) comms_[d.name] = make_group({d.name});
}

DeviceMesh DeviceMesh::megatron(Comm& world, int tp, int cp, int pp, int dp) {
  return DeviceMesh(world, MeshLayout::megatron(world.size(), tp, cp, pp, dp));
}

std::shared_ptr<Comm> DeviceMesh::make_group(const std::vector<std::string>& dims) {
  const auto members = layout_.group_of(rank(), dims);
  // Color: the group's first rank (unique per group); key: world rank, so members keep world
  // order and a single-dimension group's rank equals the coordinate along that dimension.
  return world_->split(members.front(), rank(), fmt::format("{}/{}", world_->name(), join(dims, "-")));
}

Comm& DeviceMesh::comm(const std::string& dim) { return comm(std::vector<std::string>{dim}); }

Comm& DeviceMesh::comm(const std::vector<std::string>& dims) {
  DTL_CHECK(!dims.empty(), "DeviceMesh::comm: name at least one dimension");
  // Canonical key: the dimensions in mesh order, so {"cp","dp"} and {"dp","cp"} are one group.
  std::vector<std::string> sorted;
  for (const auto& d : layout_.dims())
    if (std::find(dims.begin(), dims.end(), d.name) != dims.end()) sorted.push_back(d.name);
  for (const auto& d : dims) layout_.size(d);  // unknown names raise here
  DTL_CHECK(sorted.size() == dims.size(), "DeviceMesh::comm: a dimension is named twice");
  const std::string key = join(sorted, "-");
  auto it = comms_.find(key);
  if (it == comms_.end()) it = comms_.emplace(key, make_group(sorted)).first;
  return *it->second;
}

}  // namespace dtl
