// Anchor TU of dtl_torch_pch: it exists so CMake builds the shared <torch/torch.h>
// precompiled header once; every other torch-using target reuses that PCH.
