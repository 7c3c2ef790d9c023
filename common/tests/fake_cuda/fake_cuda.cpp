// The fake CUDA runtime and fake NCCL of nccl_layer_tests (design: cuda_runtime.h, nccl.h).
#include "fake_cuda.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "nccl.h"

// ---------------------------------------------------------------- CUDA: devices and streams

struct CUstream_st {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> work;
  uint64_t enqueued = 0, completed = 0;  // work items pushed / finished
  bool stop = false;
  std::thread worker;

  explicit CUstream_st(int d) : device(d) {
    worker = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        cv.wait(lock, [&] { return stop || !work.empty(); });
        if (work.empty()) return;
        auto fn = std::move(work.front());
        lock.unlock();
        fn();
        lock.lock();
        work.pop_front();
        ++completed;
        cv.notify_all();
      }
    });
  }
  ~CUstream_st() { shutdown(); }
  // Runs what is queued, then stops the worker. The object lives on while an event or another
  // stream's wait refers to it (shared_ptr), as a CUDA event outlives its stream.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }
  uint64_t push(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu);
    work.push_back(std::move(fn));
    cv.notify_all();
    return ++enqueued;
  }
  void wait_for(uint64_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= n; });
  }
  bool reached(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu);
    return completed >= n;
  }
  uint64_t position() {
    std::lock_guard<std::mutex> lock(mu);
    return enqueued;
  }
};

struct CUevent_st {
  std::mutex mu;
  std::shared_ptr<CUstream_st> stream;  // the stream of the last record, none before
  uint64_t mark = 0;              // done when stream->completed >= mark
};

namespace {

std::mutex g_mu;  // the registries below
int g_device_count = 2;
std::set<int> g_contexts;
std::atomic<int> g_device_syncs{0};
std::vector<std::string> g_violations;
std::map<int, CUstream_st*> g_default_streams;                    // per device
std::map<CUstream_st*, std::shared_ptr<CUstream_st>> g_streams;  // every live stream
thread_local int t_device = -1;                                  // -1: never set
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local CUstream_st* t_current = nullptr;

void violate(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_violations.push_back(what);
}

// The device this thread's calls act on; creates the context there, as CUDA does.
int current_device() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (t_device < 0) {
    g_contexts.insert(0);  // the implicit device 0
    return 0;
  }
  return t_device;
}

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

CUstream_st* add_stream(int device) {
  auto s = std::make_shared<CUstream_st>(device);
  g_streams[s.get()] = s;
  return s.get();
}

CUstream_st* resolve(cudaStream_t s) {
  if (s != cudaStreamLegacy && s != nullptr) return s;
  if (t_current) return t_current;
  const int d = current_device();
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = g_default_streams[d];
  if (!slot) slot = add_stream(d);
  return slot;
}

std::shared_ptr<CUstream_st> shared(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_streams.find(s);
  return it == g_streams.end() ? nullptr : it->second;
}

void sync_device(int d) {
  g_device_syncs++;
  std::vector<std::pair<CUstream_st*, uint64_t>> todo;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto& [raw, s] : g_streams)
      if (s->device == d) todo.emplace_back(raw, s->position());
  }
  for (auto& [s, n] : todo) s->wait_for(n);
}

}  // namespace

namespace fake_cuda {

void set_device_count(int n) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_device_count = n;
}
std::set<int> contexts() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_contexts;
}
void reset_contexts() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_contexts.clear();
}
int device_syncs() { return g_device_syncs.load(); }
void launch(cudaStream_t stream, std::function<void()> kernel) {
  resolve(stream)->push(std::move(kernel));
}
StreamGuard::StreamGuard(cudaStream_t stream) : previous_(t_current) { t_current = stream; }
StreamGuard::~StreamGuard() { t_current = previous_; }
cudaStream_t new_stream() {
  const int d = current_device();
  std::lock_guard<std::mutex> lock(g_mu);
  return add_stream(d);
}
void sync_current_stream() { cudaStreamSynchronize(cudaStreamLegacy); }
std::vector<std::string> take_violations() {
  std::lock_guard<std::mutex> lock(g_mu);
  auto out = std::move(g_violations);
  g_violations.clear();
  return out;
}

}  // namespace fake_cuda

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "fake CUDA error";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorFake";
  }
}
cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaGetDeviceCount(int* count) {
  std::lock_guard<std::mutex> lock(g_mu);
  *count = g_device_count;
  return g_device_count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = t_device < 0 ? 0 : t_device;  // no context needed to answer
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (device < 0 || device >= g_device_count) return fail(cudaErrorInvalidDevice);
  t_device = device;
  g_contexts.insert(device);  // CUDA >= 12: cudaSetDevice initialises the primary context
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (device < 0 || device >= g_device_count) return fail(cudaErrorInvalidDevice);
  }
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "fake GPU %d", device);
  // One GPU per (process, index): ranks never share one.
  const uint64_t id = (static_cast<uint64_t>(getpid()) << 8) | static_cast<uint64_t>(device);
  std::memcpy(prop->uuid.bytes, &id, sizeof(id));
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  sync_device(current_device());
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  const int d = current_device();
  std::lock_guard<std::mutex> lock(g_mu);
  *stream = add_stream(d);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::shared_ptr<CUstream_st> s;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_streams.find(stream);
    if (it == g_streams.end()) return fail(cudaErrorInvalidResourceHandle);
    s = it->second;
    g_streams.erase(it);
  }
  s->shutdown();  // runs what is queued first (CUDA returns at once and finishes it later)
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  return s->reached(s->position()) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  s->wait_for(s->position());
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  std::shared_ptr<CUstream_st> target;
  uint64_t mark;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    target = event->stream;  // the record current now, as CUDA does
    mark = event->mark;
  }
  if (!target) return cudaSuccess;
  resolve(stream)->push([target, mark] { target->wait_for(mark); });
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  const uint64_t mark = s->push([] {});
  std::lock_guard<std::mutex> lock(event->mu);
  event->stream = shared(s);
  event->mark = mark;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(event->mu);
  if (!event->stream) return cudaSuccess;
  return event->stream->reached(event->mark) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::shared_ptr<CUstream_st> s;
  uint64_t mark;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    s = event->stream;
    mark = event->mark;
  }
  if (s) s->wait_for(mark);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** ptr, size_t size) {
  current_device();
  *ptr = std::calloc(1, size ? size : 1);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* ptr) {
  sync_device(current_device());  // cudaFree synchronises the device
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  resolve(stream);
  *ptr = std::calloc(1, size ? size : 1);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  resolve(stream)->push([ptr] { std::free(ptr); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  current_device();
  std::memset(ptr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  resolve(stream)->push([=] { std::memset(ptr, value, count); });
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  resolve(stream)->push([fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

// ---------------------------------------------------------------- NCCL over MPI

namespace {

constexpr int kTagData = 7301, kTagP2p = 7302, kTagConnect = 7303, kTagJoin = 7304,
              kTagMembers = 7305;

struct CommState {
  MPI_Comm mpi = MPI_COMM_NULL;  // the members, in NCCL rank order
  MPI_Comm connect = MPI_COMM_NULL;  // lazy-connect handshakes (host side)
  int rank = 0, size = 1;
  bool nonblocking = false;
  bool lazy_collectives = true;  // NCCL_RUNTIME_CONNECT was not 0 when it was made
  std::atomic<bool> aborted{false};
  std::atomic<int> running{0};  // kernels enqueued and not over
  std::mutex mu;
  ncclResult_t async = ncclSuccess;
  std::string last_error;
  std::set<std::string> connected;  // lazy-connect keys done
  // Handshakes given up on: their buffers stay alive as long as the communicator state, since
  // MPI may still write into them (a segfault otherwise, after the give-up).
  std::vector<std::shared_ptr<void>> stalled;
};

struct Handle {
  std::shared_ptr<CommState> s;
};

int g_force_lazy = -1;  // set_runtime_connect: 1 / 0 override NCCL_RUNTIME_CONNECT, -1 follows it
double g_lazy_give_up = 8;
thread_local int t_group_depth = 0;
struct P2p {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
};
thread_local std::vector<P2p> t_group;
thread_local std::shared_ptr<CommState> t_group_comm;
thread_local cudaStream_t t_group_stream = nullptr;

size_t dtype_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

template <class T>
void reduce_into(T* acc, const T* in, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ncclSum: case ncclAvg: acc[i] = acc[i] + in[i]; break;
      case ncclProd: acc[i] = acc[i] * in[i]; break;
      case ncclMax: acc[i] = acc[i] < in[i] ? in[i] : acc[i]; break;
      case ncclMin: acc[i] = in[i] < acc[i] ? in[i] : acc[i]; break;
    }
  }
}
template <class T>
void divide(T* acc, size_t n, int by) {
  for (size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] / by);
}

void reduce_any(void* acc, const void* in, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclFloat32: return reduce_into(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    case ncclFloat64: return reduce_into(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
    case ncclInt32: return reduce_into(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n, op);
    case ncclInt64: return reduce_into(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), n, op);
    case ncclInt8: return reduce_into(static_cast<int8_t*>(acc), static_cast<const int8_t*>(in), n, op);
    case ncclUint8: return reduce_into(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), n, op);
    default: violate("fake NCCL: no reduction for this dtype");
  }
}
void divide_any(void* acc, size_t n, ncclDataType_t t, int by) {
  switch (t) {
    case ncclFloat32: return divide(static_cast<float*>(acc), n, by);
    case ncclFloat64: return divide(static_cast<double*>(acc), n, by);
    case ncclInt32: return divide(static_cast<int32_t*>(acc), n, by);
    case ncclInt64: return divide(static_cast<int64_t*>(acc), n, by);
    case ncclInt8: return divide(static_cast<int8_t*>(acc), n, by);
    case ncclUint8: return divide(static_cast<uint8_t*>(acc), n, by);
    default: break;
  }
}

// Waits for `reqs` unless the communicator is aborted first (then cancels what is open).
// Returns whether they all completed.
bool wait_all(CommState& c, std::vector<MPI_Request>& reqs) {
  while (true) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (c.aborted) {
      for (auto& r : reqs)
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// The host side of NCCL's runtime connection: the first use of each (key, peer) blocks the launch
// until that peer makes the same first use. All of one launch's handshakes are posted at once
// (a ring of sendrecvs would otherwise wait in a cycle). False when a peer never came.
bool lazy_connect(CommState& c, const std::vector<std::pair<std::string, int>>& links) {
  std::vector<std::pair<std::string, int>> fresh;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& l : links)
      if (c.connected.insert(l.first + "@" + std::to_string(l.second)).second) fresh.push_back(l);
  }
  if (fresh.empty()) return true;
  struct Handshake {
    std::vector<std::array<char, 64>> mine, theirs;
    std::vector<MPI_Request> reqs;
  };
  auto h = std::make_shared<Handshake>();
  h->mine.resize(fresh.size());
  h->theirs.resize(fresh.size());
  for (size_t i = 0; i < fresh.size(); ++i) {
    h->mine[i].fill(0);
    h->theirs[i].fill(0);
    std::snprintf(h->mine[i].data(), 64, "%s", fresh[i].first.c_str());
    h->reqs.emplace_back();
    MPI_Isend(h->mine[i].data(), 64, MPI_CHAR, fresh[i].second, kTagConnect, c.connect,
              &h->reqs.back());
    h->reqs.emplace_back();
    MPI_Irecv(h->theirs[i].data(), 64, MPI_CHAR, fresh[i].second, kTagConnect, c.connect,
              &h->reqs.back());
  }
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(g_lazy_give_up);
  while (true) {
    int done = 0;
    MPI_Testall(static_cast<int>(h->reqs.size()), h->reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > give_up) {
      violate("the host blocked in NCCL's runtime connection of '" + fresh[0].first + "' for " +
              std::to_string(g_lazy_give_up) + " s: a peer never made the same first use "
              "(the ranks issued their first ops of this communicator in different orders); real "
              "NCCL blocks here for good");
      // The receives are cancelled; a send may still be in flight, so the buffers live on with
      // the communicator, which is broken from here on.
      for (size_t i = 1; i < h->reqs.size(); i += 2)
        if (h->reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&h->reqs[i]);
      std::lock_guard<std::mutex> lock(c.mu);
      c.stalled.push_back(h);
      c.last_error = "runtime connection never completed";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (size_t i = 0; i < fresh.size(); ++i)
    if (fresh[i].first != h->theirs[i].data())
      violate("runtime connection of '" + fresh[i].first + "' met '" + h->theirs[i].data() +
              "' from rank " + std::to_string(fresh[i].second) + " (the ranks issued different ops)");
  return true;
}

// NCCL connects a pair of ranks once for point-to-point, whatever the sizes sent later.
std::string p2p_key(const CommState& c, int peer) {
  return "p2p:" + std::to_string(std::min(c.rank, peer)) + "-" +
         std::to_string(std::max(c.rank, peer));
}

std::vector<int> others(const CommState& c) {
  std::vector<int> out;
  for (int p = 0; p < c.size; ++p)
    if (p != c.rank) out.push_back(p);
  return out;
}

// Enqueues `kernel` on `stream` for comm `c`: it runs in stream order and ends early when the
// communicator is aborted.
ncclResult_t enqueue(const std::shared_ptr<CommState>& c, cudaStream_t stream,
                     std::function<void(CommState&)> kernel) {
  if (c->aborted) return ncclInvalidUsage;
  c->running++;
  fake_cuda::launch(stream, [c, kernel] {
    if (!c->aborted) kernel(*c);
    c->running--;
  });
  return c->nonblocking ? ncclInProgress : ncclSuccess;
}

std::shared_ptr<CommState> state(ncclComm_t comm) { return reinterpret_cast<Handle*>(comm)->s; }

// A collective: its runtime connection (host), then its kernel on `stream`.
ncclResult_t collective(ncclComm_t comm, cudaStream_t stream, const std::string& what,
                        size_t bytes, std::function<void(CommState&)> kernel) {
  auto c = state(comm);
  std::vector<std::pair<std::string, int>> links;
  if (c->lazy_collectives) {
    for (int p : others(*c)) links.emplace_back(what + ":" + std::to_string(bytes), p);
    if (!lazy_connect(*c, links)) return ncclSystemError;
  }
  return enqueue(c, stream, std::move(kernel));
}

// Exchanges with every other rank: send `send_of(p)` (may be null: nothing) and receive into
// `recv_of(p)` (may be null), `bytes` each.
bool exchange(CommState& c, size_t bytes, const std::function<const void*(int)>& send_of,
              const std::function<void*(int)>& recv_of) {
  std::vector<MPI_Request> reqs;
  for (int p = 0; p < c.size; ++p) {
    if (p == c.rank) continue;
    if (const void* s = send_of(p)) {
      reqs.emplace_back();
      MPI_Isend(s, static_cast<int>(bytes), MPI_BYTE, p, kTagData, c.mpi, &reqs.back());
    }
    if (void* r = recv_of(p)) {
      reqs.emplace_back();
      MPI_Irecv(r, static_cast<int>(bytes), MPI_BYTE, p, kTagData, c.mpi, &reqs.back());
    }
  }
  return wait_all(c, reqs);
}

// NCCL 2.18-2.30 read NCCL_COMM_BLOCKING after the config: when set, the variable decides,
// whatever the config's `blocking` says; unset, the config decides, else `inherited` (a split's
// parent), else blocking.
ncclResult_t make_comm(MPI_Comm members, bool inherited_nonblocking, ncclConfig_t* config,
                       ncclComm_t* out) {
  auto s = std::make_shared<CommState>();
  s->mpi = members;
  MPI_Comm_dup(members, &s->connect);
  MPI_Comm_rank(members, &s->rank);
  MPI_Comm_size(members, &s->size);
  const char* env = std::getenv("NCCL_COMM_BLOCKING");
  if (env && *env)
    s->nonblocking = std::atoi(env) == 0;
  else if (config && config->blocking != NCCL_CONFIG_UNDEF_INT)
    s->nonblocking = config->blocking == 0;
  else
    s->nonblocking = inherited_nonblocking;
  const char* connect = std::getenv("NCCL_RUNTIME_CONNECT");
  s->lazy_collectives = g_force_lazy >= 0 ? g_force_lazy == 1
                                          : !(connect && std::string(connect) == "0");
  *out = reinterpret_cast<ncclComm_t>(new Handle{s});
  return s->nonblocking ? ncclInProgress : ncclSuccess;
}

}  // namespace

namespace fake_cuda {
void set_runtime_connect(int force, double give_up_s) {
  g_force_lazy = force;
  g_lazy_give_up = give_up_s;
}
}  // namespace fake_cuda

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "fake NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// The id names rank 0's world rank and a number of its own: the members find each other
// through rank 0 over MPI_COMM_WORLD, then make their MPI communicator among themselves.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<int> counter{0};
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::memset(id, 0, sizeof(*id));
  const int parts[2] = {world_rank, counter++ % 100};
  std::memcpy(id->internal, parts, sizeof(parts));
  return ncclSuccess;
}

static ncclResult_t init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                              ncclConfig_t* config) {
  int parts[2];
  std::memcpy(parts, id.internal, sizeof(parts));
  const int root = parts[0], tag = kTagJoin + 10 * parts[1];
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::vector<int> members(static_cast<size_t>(nranks), -1);
  if (rank == 0) {
    members[0] = me;
    for (int k = 1; k < nranks; ++k) {
      int msg[2];
      MPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      members[static_cast<size_t>(msg[0])] = msg[1];
    }
    for (int k = 1; k < nranks; ++k)
      MPI_Send(members.data(), nranks, MPI_INT, members[static_cast<size_t>(k)], tag + 1,
               MPI_COMM_WORLD);
  } else {
    const int msg[2] = {rank, me};
    MPI_Send(msg, 2, MPI_INT, root, tag, MPI_COMM_WORLD);
    MPI_Recv(members.data(), nranks, MPI_INT, root, tag + 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group world, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, members.data(), &group);
  MPI_Comm mpi;
  MPI_Comm_create_group(MPI_COMM_WORLD, group, tag + 2, &mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return make_comm(mpi, false, config, comm);
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return init_rank(comm, nranks, id, rank, nullptr);
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  return init_rank(comm, nranks, id, rank, config);
}

// Collective over every member of the parent, NOCOLOR ranks included: a member that does not
// call it leaves the others waiting (recorded as a violation after 20 s, then an error).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  auto c = state(comm);
  const int mine[2] = {color, key};
  std::vector<int> all(2 * static_cast<size_t>(c->size));
  MPI_Request req;
  MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, c->connect, &req);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done && std::chrono::steady_clock::now() > give_up) {
      violate("ncclCommSplit: not every member of the parent called it within 20 s (it is "
              "collective over the parent, NCCL_SPLIT_NOCOLOR ranks included)");
      return ncclInvalidUsage;
    }
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return c->nonblocking ? ncclInProgress : ncclSuccess;
  // Members of my color, ordered by (key, parent rank).
  std::vector<std::pair<int, int>> order;
  for (int p = 0; p < c->size; ++p)
    if (all[2 * static_cast<size_t>(p)] == color) order.emplace_back(all[2 * static_cast<size_t>(p) + 1], p);
  std::sort(order.begin(), order.end());
  std::vector<int> ranks;
  for (auto& [k, p] : order) ranks.push_back(p);
  MPI_Group parent, group;
  MPI_Comm_group(c->connect, &parent);
  MPI_Group_incl(parent, static_cast<int>(ranks.size()), ranks.data(), &group);
  MPI_Comm mpi;
  MPI_Comm_create_group(c->connect, group, kTagMembers + color % 1000, &mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&parent);
  return make_comm(mpi, c->nonblocking, config, newcomm);
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = state(comm)->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  auto c = state(comm);
  c->aborted = true;  // kernels waiting for peers return
  delete reinterpret_cast<Handle*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto c = state(comm);
  while (c->running > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // flushes
  delete reinterpret_cast<Handle*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  auto c = state(comm);
  std::lock_guard<std::mutex> lock(c->mu);
  *async_error = c->async;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (--t_group_depth > 0) return ncclSuccess;
  auto parts = std::move(t_group);
  t_group.clear();
  auto c = std::move(t_group_comm);
  t_group_comm = nullptr;
  if (!c) return ncclSuccess;
  std::vector<std::pair<std::string, int>> links;
  for (auto& p : parts)
    if (p.peer != c->rank) links.emplace_back(p2p_key(*c, p.peer), p.peer);
  if (!lazy_connect(*c, links)) return ncclSystemError;
  return enqueue(c, t_group_stream, [parts](CommState& s) {
    std::vector<MPI_Request> reqs;
    const P2p* self_send = nullptr;
    const P2p* self_recv = nullptr;
    for (auto& p : parts) {
      if (p.peer == s.rank) {
        (p.send ? self_send : self_recv) = &p;
        continue;
      }
      reqs.emplace_back();
      if (p.send)
        MPI_Isend(p.buf, static_cast<int>(p.bytes), MPI_BYTE, p.peer, kTagP2p, s.mpi, &reqs.back());
      else
        MPI_Irecv(p.buf, static_cast<int>(p.bytes), MPI_BYTE, p.peer, kTagP2p, s.mpi, &reqs.back());
    }
    if (self_send && self_recv) std::memcpy(self_recv->buf, self_send->buf, self_recv->bytes);
    wait_all(s, reqs);
  });
}

// Outside a group, a send or recv is a group of one.
static ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t t, int peer,
                        ncclComm_t comm, cudaStream_t stream) {
  auto c = state(comm);
  if (peer < 0 || peer >= c->size) return ncclInvalidArgument;
  ncclGroupStart();
  if (t_group_comm && t_group_comm != c) violate("fake NCCL: one group over two communicators");
  t_group_comm = c;
  t_group_stream = stream;
  t_group.push_back({send, buf, count * dtype_size(t), peer});
  return ncclGroupEnd();
}
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return p2p(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t bytes = count * dtype_size(t);
  return collective(comm, stream, "all_reduce", bytes, [=](CommState& c) {
    std::vector<char> mine(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + bytes);
    std::vector<std::vector<char>> in(static_cast<size_t>(c.size), std::vector<char>(bytes));
    if (!exchange(c, bytes, [&](int) { return mine.data(); },
                  [&](int p) { return in[static_cast<size_t>(p)].data(); }))
      return;
    in[static_cast<size_t>(c.rank)] = mine;
    std::vector<char> acc = in[0];
    for (int p = 1; p < c.size; ++p) reduce_any(acc.data(), in[static_cast<size_t>(p)].data(), count, t, op);
    if (op == ncclAvg) divide_any(acc.data(), count, t, c.size);
    std::memcpy(recvbuff, acc.data(), bytes);
  });
}
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  const size_t bytes = recvcount * dtype_size(t);
  return collective(comm, stream, "reduce_scatter", bytes, [=](CommState& c) {
    const char* send = static_cast<const char*>(sendbuff);
    std::vector<std::vector<char>> in(static_cast<size_t>(c.size), std::vector<char>(bytes));
    if (!exchange(c, bytes, [&](int p) { return send + p * bytes; },
                  [&](int p) { return in[static_cast<size_t>(p)].data(); }))
      return;
    std::memcpy(in[static_cast<size_t>(c.rank)].data(), send + c.rank * bytes, bytes);
    std::vector<char> acc = in[0];
    for (int p = 1; p < c.size; ++p) reduce_any(acc.data(), in[static_cast<size_t>(p)].data(), recvcount, t, op);
    if (op == ncclAvg) divide_any(acc.data(), recvcount, t, c.size);
    std::memcpy(recvbuff, acc.data(), bytes);
  });
}
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t t, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = sendcount * dtype_size(t);
  return collective(comm, stream, "all_gather", bytes, [=](CommState& c) {
    char* recv = static_cast<char*>(recvbuff);
    std::vector<char> mine(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + bytes);
    if (!exchange(c, bytes, [&](int) { return mine.data(); }, [&](int p) { return recv + p * bytes; }))
      return;
    std::memcpy(recv + c.rank * bytes, mine.data(), bytes);
  });
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t t,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * dtype_size(t);
  return collective(comm, stream, "broadcast", bytes, [=](CommState& c) {
    std::vector<char> data(bytes);
    if (c.rank == root) std::memcpy(data.data(), sendbuff, bytes);
    if (!exchange(c, bytes, [&](int) -> const void* { return c.rank == root ? data.data() : nullptr; },
                  [&](int p) -> void* { return p == root ? data.data() : nullptr; }))
      return;
    std::memcpy(recvbuff, data.data(), bytes);
  });
}
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = count * dtype_size(t);
  return collective(comm, stream, "reduce", bytes, [=](CommState& c) {
    std::vector<char> mine(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + bytes);
    std::vector<std::vector<char>> in(static_cast<size_t>(c.size), std::vector<char>(bytes));
    if (!exchange(c, bytes, [&](int p) -> const void* { return p == root && c.rank != root ? mine.data() : nullptr; },
                  [&](int p) -> void* { return c.rank == root ? in[static_cast<size_t>(p)].data() : nullptr; }))
      return;
    if (c.rank != root) return;
    in[static_cast<size_t>(c.rank)] = mine;
    std::vector<char> acc = in[0];
    for (int p = 1; p < c.size; ++p) reduce_any(acc.data(), in[static_cast<size_t>(p)].data(), count, t, op);
    if (op == ncclAvg) divide_any(acc.data(), count, t, c.size);
    std::memcpy(recvbuff, acc.data(), bytes);
  });
}
