// Stand-in for comm_nccl.cpp in builds without CUDA + NCCL: every entry point explains why the
// nccl backend is missing instead of failing to link.
#include <fmt/format.h>

#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"

namespace dtl {

static const char* kNoNccl =
    "this build has no NCCL backend: CUDA toolkit or NCCL not found when configuring "
    "(install them and reconfigure, or run with --device cpu --backend mpi)";

bool nccl_compiled() { return false; }
int cuda_device_count() { throw Error(rank_prefix() + kNoNccl); }
std::shared_ptr<Comm> make_nccl_comm(Comm&, int, const std::string&) {
  throw Error(rank_prefix() + kNoNccl);
}
void nccl_check_tensor(const torch::Tensor& t, int, const char* op) {
  DTL_CHECK(t.is_cuda(), fmt::format("{}: tensor is on {} but the nccl backend moves CUDA tensors",
                                     op, t.device().str()));
}

}  // namespace dtl
