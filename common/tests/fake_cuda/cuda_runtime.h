// A fake CUDA runtime on the CPU: the part of cuda_runtime.h that the NCCL device layer
// (common/src/comm_nccl.cpp) calls, for the CPU build of that very file in nccl_layer_tests.
// "Device memory" is host memory; a stream is a thread that runs its work in order; an event
// marks a point in a stream's work. What the layer must get right about streams is modelled:
// work enqueued on one stream runs after the work before it, and after another stream's work
// only through cudaStreamWaitEvent; cudaFree and cudaDeviceSynchronize wait for every stream of
// the device (and are counted); cudaSetDevice creates a context on that device (recorded); an
// API call in a thread that never set a device uses (and so creates a context on) device 0.
// Tests drive it with fake_cuda.hpp.
#pragma once

#include <cstddef>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
};

struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef void (*cudaHostFn_t)(void* user_data);

// The caller's stream of a CPU LibTorch build: here, the calling thread's current fake stream
// (fake_cuda::StreamGuard), else its device's default stream.
#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

struct CUuuid_st {
  char bytes[16];
};
struct cudaDeviceProp {
  char name[256];
  CUuuid_st uuid;
};

const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);
