// Lab 18 benchmark: what the debugging tools cost a healthy job, which decides whether they can
// stay on in production (PyTorch's flight recorder does; TORCH_DISTRIBUTED_DEBUG=DETAIL does not).
//
//   ./lab bench 18                  2 ranks; add --solutions for the reference
//   ./lab bench 18 -n 4 -- --benchmark_filter=Desync
//
// BM_Recorded/0|1   a small all_reduce (1 KiB), without / with a FlightRecorder attached
// BM_Record         what the recorder adds to one op, alone: its three record() calls (issued,
//                   started, completed) into a full ring of 2000 entries (ns_per_op)
// BM_Desync/0|1     the same all_reduce on a CheckedComm, not checking / checking: the check is
//                   one more collective per collective
// BM_CheckFinite    check_finite over the gradients of a GPT (one collective, one host copy)
// BM_CheckReplicas  check_replicas over the parameters of the same GPT: hashing every byte, then
//                   one collective (GB_per_s: the bytes hashed per second on each rank)
// BM_Dump           FlightRecorder::dump of a full ring of 2000 entries
// Every timed call is checked: the all-reduce's sum, a check that finds nothing, a dump that
// holds every entry.
#include "dtl/harness/bench.hpp"  // defines: bench::Iteration

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include <unistd.h>  // getpid (LibTorch 1.13 brought it in, 2.x does not)

#include "debug.hpp"
#include "dtl/error.hpp"
#include "dtl/runtime.hpp"

namespace {

namespace fs = std::filesystem;
using namespace dtl::lab18;

constexpr int64_t kSmall = 256;  // float32 elements: 1 KiB, latency-bound

std::shared_ptr<dtl::Comm> bench_comm() {
  static auto comm = dtl::world().split(0, dtl::world().rank(), "bench");
  return comm;
}

// Times all_reduce of kSmall floats through `run`, checking every result against the sum.
void time_small_all_reduce(benchmark::State& state, const std::function<void(const torch::Tensor&)>& run) {
  dtl::Comm& comm = *bench_comm();
  const int n = comm.size();
  auto f = torch::TensorOptions().device(comm.device());
  torch::Tensor t = torch::empty({kSmall}, f);
  const double want = n * (n + 1) / 2.0;
  for (auto _ : state) {
    t.fill_(comm.rank() + 1);
    {
      dtl::bench::Iteration it(state);
      run(t);
    }
    if (!torch::all(t == want).item<bool>()) {
      state.SkipWithError("wrong result: the all-reduce's sum");
      break;
    }
  }
  state.counters["us_per_op"] = dtl::bench::mean_iteration_seconds(state) * 1e6;
}

void BM_Recorded(benchmark::State& state) {
  try {
    FlightRecorder fr(2000);
    if (state.range(0)) fr.attach();
    dtl::Comm& comm = *bench_comm();
    time_small_all_reduce(state, [&](const torch::Tensor& t) { comm.all_reduce(t); });
    fr.detach();
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());  // "not implemented" in an untouched skeleton
  }
}

void BM_Record(benchmark::State& state) {
  constexpr uint64_t kOps = 10000;
  try {
    dtl::Comm& comm = *bench_comm();
    FlightRecorder fr(2000);
    dtl::OpRecord r;
    r.op = dtl::OpType::AllReduce;
    r.dtype = "float";
    r.shape = {kSmall};
    r.bytes = kSmall * 4;
    uint64_t seq = 0;
    for (auto _ : state) {
      {
        dtl::bench::Iteration it(state);
        for (uint64_t k = 0; k < kOps; ++k) {
          r.seq = ++seq;
          r.state = dtl::OpRecord::State::Issued;
          fr.record(comm, r);
          r.state = dtl::OpRecord::State::Started;
          fr.record(comm, r);
          r.state = dtl::OpRecord::State::Completed;
          fr.record(comm, r);
        }
      }
      const auto e = fr.entries();
      if (e.size() != 2000 || e.back().seq != seq || e.back().state != "completed" || e.front().state != "completed") {
        state.SkipWithError("wrong result: the ring does not hold the last 2000 ops, completed");
        break;
      }
    }
    state.counters["ns_per_op"] = dtl::bench::mean_iteration_seconds(state) / kOps * 1e9;
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Desync(benchmark::State& state) {
  try {
    CheckedComm cc(*bench_comm(), state.range(0) != 0);
    time_small_all_reduce(state, [&](const torch::Tensor& t) { cc.all_reduce(t); });
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_CheckFinite(benchmark::State& state) {
  try {
    dtl::Comm& comm = *bench_comm();
    dtl::model::GPT m(dtl::model::GPTConfig::small());
    m->to(comm.device());
    NamedTensors grads;
    for (const auto& item : m->named_parameters()) grads.emplace_back(item.key(), torch::randn_like(item.value()));
    for (auto _ : state) {
      const int64_t before = comm.stats().total_count();
      {
        dtl::bench::Iteration it(state);
        check_finite(comm, grads, 0, "gradient");
      }
      if (comm.stats().total_count() - before != 1) {
        state.SkipWithError("wrong result: check_finite must be one collective");
        break;
      }
    }
    state.counters["tensors"] = static_cast<double>(grads.size());
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_CheckReplicas(benchmark::State& state) {
  try {
    dtl::Comm& comm = *bench_comm();
    dtl::model::GPT m(dtl::model::GPTConfig::small());  // the same seed on every rank: equal replicas
    m->to(comm.device());
    NamedTensors params;
    int64_t bytes = 0;
    for (const auto& item : m->named_parameters()) {
      params.emplace_back(item.key(), item.value());
      bytes += static_cast<int64_t>(item.value().nbytes());
    }
    for (auto _ : state) {
      const int64_t before = comm.stats().total_count();
      {
        dtl::bench::Iteration it(state);
        check_replicas(comm, params, 0);
      }
      if (comm.stats().total_count() - before != 1) {
        state.SkipWithError("wrong result: check_replicas must be one collective");
        break;
      }
    }
    state.counters["tensors"] = static_cast<double>(params.size());
    state.counters["MB"] = static_cast<double>(bytes) / 1e6;
    state.counters["GB_per_s"] = static_cast<double>(bytes) / 1e9 / dtl::bench::mean_iteration_seconds(state);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Dump(benchmark::State& state) {
  const size_t kEntries = 2000;
  try {
    dtl::Comm& comm = *bench_comm();
    const std::string dir = fs::temp_directory_path() / fmt::format("dtl-lab18-bench-{}", ::getpid());
    FlightRecorder fr(kEntries);
    for (uint64_t seq = 1; seq <= kEntries; ++seq) {
      dtl::OpRecord r;
      r.seq = seq;
      r.op = dtl::OpType::AllReduce;
      r.dtype = "float";
      r.shape = {1024, 1024};
      r.bytes = 4 << 20;
      r.issued = static_cast<double>(seq);
      fr.record(comm, r);
    }
    std::string path;
    for (auto _ : state) {
      {
        dtl::bench::Iteration it(state);
        path = fr.dump(dir, "benchmark");
      }
      std::ifstream in(path);
      const auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || j["entries"].size() != kEntries) {
        state.SkipWithError("wrong result: the dump does not hold every entry");
        break;
      }
    }
    if (!path.empty()) state.counters["KiB"] = static_cast<double>(fs::file_size(path)) / 1024;
    fs::remove_all(dir);
  } catch (const dtl::Error& e) {
    state.SkipWithError(e.what());
  }
}

BENCHMARK(BM_Recorded)->Arg(0)->Arg(1)->Iterations(2000)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Record)->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Desync)->Arg(0)->Arg(1)->Iterations(2000)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CheckFinite)->Iterations(50)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CheckReplicas)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Dump)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
