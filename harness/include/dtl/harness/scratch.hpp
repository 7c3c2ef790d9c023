// dtl/harness/scratch.hpp — defines: ScratchDir (a fresh directory every rank of a Comm names
// alike), broadcast_string.
//
// Tests that write files (checkpoints in lab 17, flight-recorder dumps in lab 18) need one
// directory that every rank agrees on, new for each test and gone after it.
#pragma once

#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "dtl/comm.hpp"
#include "dtl/error.hpp"

namespace dtl::testing {

// Collective over comm: rank `root`'s string, on every rank.
inline std::string broadcast_string(Comm& comm, const std::string& mine, int root = 0) {
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(comm.device());
  torch::Tensor length = torch::full({1}, static_cast<int64_t>(mine.size()), opts);
  comm.broadcast(length, root);
  const int64_t n = length.cpu().item<int64_t>();
  torch::Tensor bytes = torch::zeros({n}, torch::kUInt8);
  if (comm.rank() == root) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  bytes = bytes.to(comm.device());
  comm.broadcast(bytes, root);
  torch::Tensor host = bytes.cpu();
  return std::string(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
}

// A fresh, empty directory under $TMPDIR (or /tmp) named `prefix`-XXXXXX, made by rank 0 of
// comm and named alike on every rank; removed by the destructor (rank 0, after a barrier).
class ScratchDir {
 public:
  explicit ScratchDir(Comm& comm, const std::string& prefix = "dtl-test") : comm_(comm) {
    std::string mine;
    if (comm.rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::string pattern =
          (std::filesystem::path(base && *base ? base : "/tmp") / (prefix + "-XXXXXX")).string();
      DTL_CHECK(mkdtemp(pattern.data()) != nullptr, "ScratchDir: mkdtemp failed for " + pattern);
      mine = pattern;
    }
    path_ = broadcast_string(comm, mine);
  }
  ~ScratchDir() {
    comm_.barrier();
    if (comm_.rank() == 0) std::filesystem::remove_all(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& sub) const {
    return (std::filesystem::path(path_) / sub).string();
  }

 private:
  Comm& comm_;
  std::string path_;
};

}  // namespace dtl::testing
