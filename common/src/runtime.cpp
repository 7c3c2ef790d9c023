// Runtime: MPI start-up, rank discovery, device and backend choice, seeding, threads, shutdown.
#include <torch/version.h>

#include "dtl/runtime.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

#include "dtl/blas.hpp"
#include "dtl/comm_mpi.hpp"
#include "dtl/comm_nccl.hpp"
#include "dtl/error.hpp"
#include "dtl/memory.hpp"
#include "dtl/net.hpp"
#include "dtl/timer.hpp"
#include "dtl/trace.hpp"

namespace dtl {

namespace detail {
void set_log_identity(int rank, int world);  // log.cpp
}

static Runtime* g_runtime = nullptr;

static const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

RuntimeOptions RuntimeOptions::from_env() {
  RuntimeOptions o;
  if (auto v = env("DTL_DEVICE")) o.device = v;
  if (auto v = env("DTL_BACKEND")) o.backend = v;
  if (auto v = env("DTL_SEED")) o.seed = std::strtoull(v, nullptr, 10);
  if (auto v = env("DTL_THREADS")) o.threads = std::atoi(v);
  if (auto v = env("DTL_NET")) o.net = v;
  if (auto v = env("DTL_TRACE")) o.trace = v;
  if (auto v = env("DTL_GANTT")) o.gantt = std::string(v) != "0";
  return o;
}

void RuntimeOptions::add_to(CLI::App& app) {
  app.add_option("--device", device, "cpu or cuda (env DTL_DEVICE)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--backend", backend, "mpi or nccl; default: nccl for cuda, mpi for cpu")
      ->check(CLI::IsMember({"", "mpi", "nccl"}));
  app.add_option("--seed", seed, "base random seed (env DTL_SEED)");
  app.add_option("--threads", threads, "intra-op threads per rank; 0 = cores / local ranks");
  app.add_option("--net", net, "emulated network: preset or intra=BW,LAT;inter=BW,LAT;ranks_per_node=K");
  app.add_option("--trace", trace, "write a Chrome trace (Perfetto) of the run to this file");
  app.add_flag("--gantt", gantt, "print a terminal Gantt chart of the run at exit");
}

Runtime::Runtime(int argc, char** argv) : options_(RuntimeOptions::from_env()) {
  // Parse only our own flags; everything else (gtest, benchmark, program flags) passes through.
  CLI::App app;
  app.set_help_flag();  // --help belongs to the program
  app.allow_extras();
  options_.add_to(app);
  if (argc > 0 && argv) {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      throw Error(fmt::format("bad runtime flag: {}", e.what()));
    }
  }
  init(argc, argv);
}

Runtime::Runtime(RuntimeOptions options, int argc, char** argv) : options_(std::move(options)) {
  init(argc, argv);
}

// Keeps freed memory in the process for the next step: the CPU analogue of PyTorch's CUDA
// caching allocator. glibc serves a block above its mmap threshold (128 KiB at start, raised
// only as large blocks get freed) with a fresh mmap and returns it to the OS when freed, and
// trims the heap's free top above twice that; the next step takes the same bytes back, one
// zero-filled page fault per 4 KiB. Measured on lab 04's demo model (one rank, batch 64):
// 2.3x the page faults of the same model in PyTorch and 7-8% of the step; in lab 13 it made
// the step without checkpointing slower than full recomputation. 32 MiB is glibc's
// largest mmap threshold (larger tensors still get their own mmap); the heap is trimmed only
// above 1 GiB free. The tracker (dtl/memory.hpp) counts what tensors ask for, so its numbers
// do not change. A MALLOC_*_ variable or GLIBC_TUNABLES in the environment wins.
static void keep_freed_memory() {
#if defined(__GLIBC__)
  if (env("MALLOC_MMAP_THRESHOLD_") || env("MALLOC_TRIM_THRESHOLD_") || env("GLIBC_TUNABLES"))
    return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

static int env_int(const char* name, int fallback) {
  const char* v = env(name);
  return v ? std::atoi(v) : fallback;
}

void Runtime::init(int argc, char** argv) {
  DTL_CHECK(g_runtime == nullptr, "only one dtl::Runtime may exist per process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    mpi_check(MPI_Init_thread(argc > 0 ? &argc : nullptr, argc > 0 ? &argv : nullptr,
                              MPI_THREAD_MULTIPLE, &provided),
              "MPI_Init_thread");
    // Comm workers call MPI from their own threads, concurrently with the main thread.
    DTL_CHECK(provided == MPI_THREAD_MULTIPLE,
              "this MPI library does not provide MPI_THREAD_MULTIPLE (OpenMPI 4 does)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  detail::set_log_identity(rank_, world_size_);
  g_runtime = this;

  // Local rank: the launcher's word first (OpenMPI, then Slurm), else ask MPI which ranks
  // share this node's memory.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int node_rank = 0, node_size = 1;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  local_rank_ = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", node_rank));
  local_size_ = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", node_size);

  // Oversubscribed ranks must not fight over cores: split the node's cores between them.
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  threads_ = options_.threads > 0 ? options_.threads : std::max(1, cores / std::max(1, local_size_));
  torch::set_num_threads(threads_);
  // A threaded BLAS would start its own pool of `cores` threads in every rank: cap it too.
  set_blas_threads(threads_);
  blas_ = blas_info();

  torch::manual_seed(options_.seed + static_cast<uint64_t>(rank_));
  keep_freed_memory();
  memory::install();

  DTL_CHECK(options_.device == "cpu" || options_.device == "cuda",
            fmt::format("--device must be cpu or cuda, got '{}'", options_.device));
  backend_ = options_.backend.empty() ? (options_.device == "cuda" ? "nccl" : "mpi") : options_.backend;
  DTL_CHECK(backend_ == "mpi" || backend_ == "nccl",
            fmt::format("--backend must be mpi or nccl, got '{}'", backend_));
  DTL_CHECK(!(backend_ == "nccl" && options_.device == "cpu"),
            "--backend nccl moves CUDA tensors: use it with --device cuda");
  DTL_CHECK(!(backend_ == "mpi" && options_.device == "cuda"),
            "--backend mpi moves CPU tensors: use --device cpu, or --backend nccl for cuda");
#if !DTL_TORCH_HAS_CUDA
  // Said now, not as LibTorch's generic error at the first CUDA tensor (cmake/DtlGpu.cmake sets
  // DTL_TORCH_HAS_CUDA for a CUDA LibTorch).
  DTL_CHECK(options_.device != "cuda",
            fmt::format("--device cuda: this build's LibTorch {} is CPU-only (it cannot make CUDA "
                        "tensors); rebuild against a CUDA LibTorch (notes/gpu.md: ./lab kit, or "
                        "DTL_CMAKE_ARGS=-DTorch_DIR=...) or run with --device cpu",
                        TORCH_VERSION));
#endif

  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup");

  // Network emulator: every rank parses the same spec (a bad one fails everywhere alike).
  net::Spec spec = net::Spec::parse(options_.net);
  net::set(spec);
  if (spec.enabled && rank_ == 0)
    std::fprintf(stderr, "dtl: network emulator %s\n", spec.describe().c_str());
  if (!blas_.optimized && options_.device == "cpu" && rank_ == 0)
    std::fprintf(stderr,
                 "dtl: warning: CPU matmuls use the %s (%s), 2-4 GFLOP/s per core; OpenBLAS is "
                 "~20x faster: run ./lab setup (or apt-get install libopenblas0-serial)\n",
                 blas_.name.c_str(), blas_.library.empty() ? "?" : blas_.library.c_str());
  // Tracing: a common time origin, taken right after a barrier, aligns the ranks' timelines.
  if (!options_.trace.empty() || options_.gantt) {
    MPI_Barrier(control_);
    trace::set_origin(now_seconds());
    trace::enable(true);
  }
  try {
    cpu_world_ = MpiComm::create(MPI_COMM_WORLD, "world");
    if (backend_ == "nccl") {
      // One GPU per rank: local rank modulo the node's device count.
      int devices = cuda_device_count();
      int index = local_rank_ % devices;
      device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
      cuda_set_current_device(index);  // else every rank's first context lands on GPU 0
      world_ = make_nccl_comm(*cpu_world_, index, "world", local_size_);
    } else {
      world_ = cpu_world_;
    }
  } catch (...) {
    world_.reset();
    cpu_world_.reset();
    g_runtime = nullptr;
    throw;
  }
}

void Runtime::finish_trace() noexcept {
  if (options_.trace.empty() && !options_.gantt) return;
  try {
    trace::enable(false);
    if (!options_.trace.empty()) trace::write_chrome(options_.trace);
    if (options_.gantt) {
      auto all = trace::gather_to_rank0();
      if (rank_ == 0) std::fputs(trace::gantt(all, 100).c_str(), stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%strace output failed: %s\n", rank_prefix().c_str(), e.what());
  }
}

Runtime::~Runtime() {
  finish_trace();
  // Drain and free our communicators before MPI goes away.
  world_.reset();
  cpu_world_.reset();
  g_runtime = nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
  MPI_Finalize();
}

Runtime& Runtime::get() {
  if (!g_runtime) throw Error("no dtl::Runtime: create one at the start of main()");
  return *g_runtime;
}

bool Runtime::exists() { return g_runtime != nullptr; }

}  // namespace dtl
