// dtl/storage.hpp — defines: free_storage, alloc_storage.
//
// Storage surgery, the C++ form of what FSDP does with `storage().resize_(0)`: a sharded
// wrapper keeps a unit's full parameters in one flat buffer that exists only while the unit
// runs. free_storage(t) releases the memory of t's storage and leaves every tensor that views it
// (the module's parameters, tensors autograd saved for backward) with its shape but no bytes;
// alloc_storage(t) gives that storage t.numel() elements again (uninitialised: all-gather into
// it). Views stay views of it, so what autograd saved in forward reads the re-gathered values in
// backward. Both work on any device (the storage's own allocator). Used by labs 14 (ZeRO-3) and
// 15 (FSDP).
#pragma once

#include <torch/torch.h>

#include <cstddef>

#include "dtl/error.hpp"  // defines: DTL_CHECK

namespace dtl {

inline void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

inline void alloc_storage(const torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  DTL_CHECK(s->allocator() != nullptr, "alloc_storage: the storage has no allocator");
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

// Whether t's storage currently holds memory (false after free_storage).
inline bool has_storage(const torch::Tensor& t) { return t.storage().nbytes() > 0; }

}  // namespace dtl
