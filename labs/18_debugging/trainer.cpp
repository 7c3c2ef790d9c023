// trainer.cpp — lab 18: the given part (findings as JSON, the watchdog's thread, ending a job,
// the data-parallel trainer with its fault injection, and the debugged job that puts your
// tools together). Your work is in debug.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt >= 11 declares it here only)

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>

#include "debug.hpp"
#include "dtl/data.hpp"
#include "dtl/log.hpp"
#include "dtl/memory.hpp"
#include "dtl/runtime.hpp"
#include "dtl/split.hpp"
#include "dtl/timer.hpp"

namespace dtl::lab18 {

// ---------------------------------------------------------------- findings

void to_json(nlohmann::json& j, const Finding& f) {
  j = {{"kind", f.kind}, {"ranks", f.ranks}, {"comm", f.comm}, {"seq", f.seq}, {"op", f.op},
       {"name", f.name}, {"step", f.step}, {"message", f.message}};
}

void from_json(const nlohmann::json& j, Finding& f) {
  f.kind = j.value("kind", "");
  f.ranks = j.value("ranks", std::vector<int>{});
  f.comm = j.value("comm", "");
  f.seq = j.value("seq", uint64_t{0});
  f.op = j.value("op", "");
  f.name = j.value("name", "");
  f.step = j.value("step", int64_t{-1});
  f.message = j.value("message", "");
}

std::string format_ranks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank";
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  return fmt::format("ranks [{}]", fmt::join(ranks, ","));
}

std::string describe_op(const std::string& op, uint64_t seq, const std::string& comm) {
  return fmt::format("{} #{} on comm '{}'", op, seq, comm);
}

std::string Analysis::report() const {
  std::string out = fmt::format("[dtl-fr] {} ranks, dumps from {}\n", world_size,
                                dumped.size() == static_cast<size_t>(world_size)
                                    ? std::string("every rank")
                                    : format_ranks(dumped));
  for (size_t i = 0; i < findings.size(); ++i)
    out += fmt::format("  {}. [{}] {}\n", i + 1, findings[i].kind, findings[i].message);
  return out;
}

// ---------------------------------------------------------------- PeriodicThread

struct PeriodicThread::State {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};

PeriodicThread::PeriodicThread(double period_s, std::function<void()> tick)
    : s_(std::make_unique<State>()) {
  DTL_CHECK(period_s > 0, fmt::format("PeriodicThread: period {} s must be > 0", period_s));
  State* s = s_.get();
  s->thread = std::thread([s, period_s, tick = std::move(tick)] {
    const auto period = std::chrono::duration<double>(period_s);
    std::unique_lock<std::mutex> lock(s->mu);
    while (!s->cv.wait_for(lock, period, [s] { return s->stop; })) {
      lock.unlock();
      try {
        tick();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%sPeriodicThread: tick failed, ticking stops: %s\n",
                     rank_prefix().c_str(), e.what());
        return;
      }
      lock.lock();
    }
  });
}

PeriodicThread::~PeriodicThread() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
}

void end_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// ---------------------------------------------------------------- the trainer

TrainConfig::TrainConfig() : model(model::GPTConfig::tiny()) { optim.eps = 1e-6; }

namespace {

// AdamW keeps its state in a map keyed by the parameter's TensorImpl: as a string in LibTorch
// 1.13, as the pointer itself in later versions. Either way, this finds a parameter's entry.
template <typename StateMap>
torch::optim::AdamWParamState* adamw_state(StateMap& state, const torch::Tensor& p) {
  using Key = typename StateMap::key_type;
  Key key;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    key = os.str();
  } else {
    key = p.unsafeGetTensorImpl();
  }
  auto it = state.find(key);
  return it == state.end() ? nullptr : dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
}

// fault.json: what was injected where, and when (for the time from fault to report).
void write_fault_note(const std::string& dir, const Fault& f) {
  if (dir.empty()) return;
  const nlohmann::json j = {{"kind", f.kind}, {"rank", f.rank}, {"step", f.step}, {"time", now_seconds()}};
  std::ofstream(dir + "/fault.json") << j.dump() << "\n";
  std::fprintf(stderr, "[rank %d] fault injection: %s in step %lld\n", f.rank, f.kind.c_str(),
               static_cast<long long>(f.step));
  std::fflush(stderr);
}

}  // namespace

struct Trainer::State {
  TrainConfig cfg;
  Comm* world = nullptr;
  std::shared_ptr<Comm> grads, metrics;
  std::unique_ptr<CheckedComm> checked;
  model::GPT model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  data::SyntheticCorpus corpus;
  data::GlobalBatchSampler sampler;
  std::string phase = "idle";
  State(const TrainConfig& c, Comm& w)
      : cfg(c), world(&w), corpus(c.model.vocab_size, c.data_seed),
        sampler(corpus, c.global_batch, c.model.seq_len) {}
  bool fault(const char* kind, int64_t step) const {
    return cfg.fault.kind == kind && cfg.fault.step == step && world->rank() == cfg.fault.rank;
  }
};

Trainer::Trainer(const TrainConfig& config, Comm& world)
    : s_(std::make_unique<State>(config, world)) {
  config.model.validate();
  DTL_CHECK(config.global_batch >= world.size(),
            fmt::format("Trainer: global_batch={} leaves a rank of {} without rows",
                        config.global_batch, world.size()));
  const std::string& k = config.fault.kind;
  DTL_CHECK(k.empty() || k == "skip" || k == "shape" || k == "sleep" || k == "crash" ||
                k == "oom" || k == "nan" || k == "flip",
            fmt::format("Trainer: unknown fault '{}' (skip, shape, sleep, crash, oom, nan, flip)", k));
  DTL_CHECK(k != "shape" || config.desync_check,
            "Trainer: the shape fault needs desync_check: without it, ranks would run one "
            "all_reduce with different sizes, which MPI and NCCL leave undefined");
  s_->grads = world.split(0, world.rank(), "grads");
  s_->metrics = world.split(0, world.rank(), "metrics");
  s_->checked = std::make_unique<CheckedComm>(*s_->grads, config.desync_check);
  {
    memory::Scope tag("parameters");
    s_->model = model::GPT(config.model);
    s_->model->to(world.device());
  }
  s_->optimizer = make_adamw(*s_->model, config.optim);
}

Trainer::~Trainer() = default;

Comm& Trainer::grads() const { return *s_->grads; }
Comm& Trainer::metrics() const { return *s_->metrics; }
const std::string& Trainer::phase() const { return s_->phase; }

NamedTensors Trainer::named_parameters() const {
  NamedTensors out;
  for (const auto& item : s_->model->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

NamedTensors Trainer::named_optimizer_state() const {
  NamedTensors out;
  for (const auto& [name, p] : named_parameters()) {
    if (auto* st = adamw_state(s_->optimizer->state(), p)) {
      out.emplace_back(name + ".exp_avg", st->exp_avg());
      out.emplace_back(name + ".exp_avg_sq", st->exp_avg_sq());
    }
  }
  return out;
}

float Trainer::step(int64_t step) {
  State& s = *s_;
  const TrainConfig& cfg = s.cfg;
  const int n = s.world->size(), r = s.world->rank();
  const Range rows = split_range(cfg.global_batch, n, r);
  const double weight = static_cast<double>(rows.size()) / static_cast<double>(cfg.global_batch);

  if (s.fault("oom", step)) {
    write_fault_note(cfg.dump_dir, cfg.fault);
    memory::set_limit(memory::current_bytes() + (16 << 10));
  }
  // Forward, piece by piece, keeping each piece's output: the activations check_finite looks at.
  s.phase = "forward";
  for (auto& p : s.model->parameters()) p.mutable_grad().reset();
  NamedTensors activations;
  torch::Tensor loss;
  {
    memory::Scope tag("activations");
    torch::Tensor tokens = s.sampler.rows(step, rows.begin, rows.end).to(s.world->device());
    const int64_t T = tokens.size(1) - 1;
    torch::Tensor x = s.model->embed(tokens.narrow(1, 0, T));
    activations.emplace_back("embed", x);
    for (int64_t i = 0; i < cfg.model.n_layer; ++i) {
      x = s.model->block(i)->forward(x);
      activations.emplace_back(fmt::format("blocks.{}", i), x);
    }
    torch::Tensor logits = s.model->head(x);
    activations.emplace_back("logits", logits);
    loss = model::lm_loss(logits, tokens.narrow(1, 1, T)) * weight;
  }
  if (cfg.nan_check) {
    s.phase = "activation check";
    check_finite(*s.grads, activations, step, "activation");
  }
  activations.clear();

  s.phase = "backward";
  {
    memory::Scope tag("gradients");
    loss.backward();
  }
  NamedTensors grads;
  for (const auto& [name, p] : named_parameters())
    grads.emplace_back(name, p.grad().defined() ? p.grad() : torch::zeros_like(p));
  if (s.fault("nan", step)) {
    write_fault_note(cfg.dump_dir, cfg.fault);
    for (auto& [name, g] : grads)
      if (name == cfg.nan_param) g.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
  }
  if (cfg.nan_check) {
    s.phase = "gradient check";
    check_finite(*s.grads, grads, step, "gradient");
  }

  s.phase = "gradient all-reduce";
  torch::Tensor flat;
  {
    memory::Scope tag("communication");
    std::vector<torch::Tensor> pieces;
    for (const auto& [name, g] : grads) pieces.push_back(g.reshape({-1}));
    if (s.fault("shape", step)) {
      write_fault_note(cfg.dump_dir, cfg.fault);
      pieces.push_back(torch::zeros({1}, pieces[0].options()));  // one element more than the others
    }
    flat = torch::cat(pieces);
  }
  if (s.fault("sleep", step)) {
    write_fault_note(cfg.dump_dir, cfg.fault);
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
  if (s.fault("crash", step)) {
    write_fault_note(cfg.dump_dir, cfg.fault);
    std::raise(SIGKILL);
  }
  if (s.fault("skip", step)) {
    write_fault_note(cfg.dump_dir, cfg.fault);  // and no all-reduce: each rank's own gradient
  } else {
    s.checked->all_reduce(flat);  // the sum of the ranks' weighted shares: the global mean's gradient
  }
  {
    torch::NoGradGuard no_grad;
    int64_t offset = 0;
    for (const auto& [name, g] : grads) {
      g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }

  s.phase = "optimizer";
  {
    memory::Scope tag("optimizer");
    s.optimizer->step();
  }
  if (s.fault("flip", step)) {
    write_fault_note(cfg.dump_dir, cfg.fault);
    // One bit of one element, the lowest of the mantissa: the value moves by one ULP, as after
    // a bit flip in memory. Every later collective still matches in size on every rank.
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : named_parameters())
      if (name == cfg.nan_param) {
        DTL_CHECK(p.scalar_type() == torch::kFloat32, "Trainer: the flip fault needs float32 parameters");
        p.detach().view({-1}).narrow(0, 0, 1).view(torch::kInt32).bitwise_xor_(1);
      }
  }
  s.phase = "metrics";
  torch::Tensor total = loss.detach().reshape({1}).clone();
  s.metrics->all_reduce(total);
  if (cfg.replica_check) {
    s.phase = "replica check";
    check_replicas(*s.metrics, named_parameters(), step);
  }
  s.phase = "idle";
  return total.item<float>();
}

// ---------------------------------------------------------------- the debugged job

namespace {

// The Finding of an exception a step raised, on this rank.
Finding finding_of(const std::exception_ptr& error, const Trainer& trainer, int64_t step) {
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemory& e) {
    memory::set_limit(0);  // the report and the dump must be able to allocate
    return oom_report(e, trainer.named_parameters(), trainer.named_optimizer_state(), step,
                      trainer.phase())
        .finding();
  } catch (const DesyncError& e) {
    return e.finding;
  } catch (const NonFiniteError& e) {
    return e.finding;
  } catch (const DivergenceError& e) {
    return e.finding;
  } catch (const NotImplemented&) {
    throw;  // an unfinished lab fails as such
  } catch (const Error& e) {
    Finding f;
    f.kind = "error";
    f.ranks = {Runtime::get().rank()};
    f.name = trainer.phase();
    f.step = step;
    f.message = fmt::format("rank {} failed in the {} of step {}: {}", Runtime::get().rank(),
                            trainer.phase(), step, e.what());
    return f;
  }
}

}  // namespace

int debug_job(const JobConfig& config, Comm& world) {
  JobConfig cfg = config;
  cfg.train.dump_dir = cfg.watchdog.dir;
  std::filesystem::create_directories(cfg.watchdog.dir);
  FlightRecorder recorder(cfg.capacity);
  recorder.attach();
  Watchdog watchdog(recorder, cfg.watchdog);
  Trainer trainer(cfg.train, world);

  std::exception_ptr error;
  int64_t step = 0;
  try {
    for (; step < cfg.train.steps; ++step) {
      const float loss = trainer.step(step);
      if (world.rank() == 0) std::printf("step %lld: loss %.4f\n", static_cast<long long>(step), loss);
    }
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  if (error) {
    const Finding why = finding_of(error, trainer, step);
    std::fprintf(stderr, "[rank %d] failed: %s\n", world.rank(), why.message.c_str());
    std::fflush(stderr);
    watchdog.fail(why);
    // The watchdog (this rank's or the reporter's) ends the job. Were it never to, end it anyway.
    const WatchdogOptions& w = cfg.watchdog;
    const double deadline = now_seconds() + w.timeout_s + 4 * w.grace_s + 10;
    while (!watchdog.ended() && now_seconds() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!watchdog.ended()) end_job(kWatchdogExitCode);
    return kWatchdogExitCode;  // only with an end_job of the caller's that returns
  }
  recorder.dump(cfg.watchdog.dir, "on demand: end of run");
  world.barrier();
  if (world.rank() == 0) std::printf("%s", analyze(cfg.watchdog.dir).report().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace dtl::lab18
