// Stand-in for comm_nccl.cpp in builds without CUDA + NCCL (>= 2.10): every entry point
// explains why the nccl backend is missing instead of failing to link. The tensor, tag and
// rank-count checks are inline in comm_nccl.hpp and behave as in the real backend.
#include "dtl/comm_nccl.hpp"

namespace dtl {

static const char* kNoNccl =
    "this build has no NCCL backend: CUDA toolkit or NCCL >= 2.10 not found when configuring "
    "(install them and reconfigure, or run with --device cpu --backend mpi)";

bool nccl_compiled() { return false; }
std::string nccl_version_string() { return "none (built without NCCL)"; }
int cuda_device_count() { throw Error(rank_prefix() + kNoNccl); }
void cuda_set_current_device(int) { throw Error(rank_prefix() + kNoNccl); }
std::shared_ptr<Comm> make_nccl_comm(Comm&, int, const std::string&) {
  throw Error(rank_prefix() + kNoNccl);
}
std::shared_ptr<Comm> make_nccl_comm(Comm&, int, const std::string&, int) {
  throw Error(rank_prefix() + kNoNccl);
}

}  // namespace dtl
