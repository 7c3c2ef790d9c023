// trainer.cpp — lab 17: the given part (the sharded data-parallel trainer, CRC-32, dtype names,
// string gathering, the background thread, fault injection, the checkpointed training loop).
// Your work is in checkpoint.cpp.
#include <fmt/format.h>

#include <array>
#include <csignal>
#include <cstdlib>
#include <sstream>

#include "checkpoint.hpp"
#include "dtl/error.hpp"
#include "dtl/runtime.hpp"
#include "dtl/timer.hpp"

namespace dtl::lab17 {

// ---------------------------------------------------------------- Trainer

Trainer::Trainer(const TrainConfig& config, Comm& comm)
    : config_(config),
      comm_(&comm),
      corpus_(config.model.vocab_size, config.data_seed),
      sampler_(corpus_, config.global_batch, config.model.seq_len) {
  config.model.validate();
  DTL_CHECK(config.global_batch >= 1, "Trainer: global_batch must be >= 1");
  model = model::GPT(config.model);
  model->to(comm.device());
  for (const auto& item : model->named_parameters()) {
    names.push_back(item.key());
    params.push_back(item.value());
    const Range r = split_range(item.value().numel(), comm.size(), comm.rank());
    owned.push_back(r);
    exp_avg.push_back(torch::zeros({r.size()}, item.value().options().requires_grad(false)));
    exp_avg_sq.push_back(torch::zeros({r.size()}, item.value().options().requires_grad(false)));
  }
}

torch::Tensor Trainer::flat_params() const {
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().reshape({-1}));
  return torch::cat(flat);
}

void Trainer::gather_params() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor flat = params[i].detach().view({-1});
    comm_->all_gather(flat, flat.narrow(0, owned[i].begin, owned[i].size()).clone());
  }
}

float Trainer::train_step() {
  const int n = comm_->size(), r = comm_->rank();
  const int64_t B = config_.global_batch;
  DTL_CHECK(data_position % B == 0,
            fmt::format("Trainer: data_position={} is not a multiple of global_batch={}",
                        data_position, B));
  const Range rows = split_range(B, n, r);
  model->train();
  for (auto& p : params) p.mutable_grad().reset();
  torch::Tensor loss = torch::zeros({}, params[0].options().requires_grad(false));
  if (rows.size() > 0) {
    // This rank's share of the global mean: its rows' mean loss times rows / B.
    torch::Tensor tokens =
        sampler_.rows(data_position / B, rows.begin, rows.end).to(comm_->device());
    torch::Tensor local = model->loss(tokens) * (static_cast<double>(rows.size()) / B);
    local.backward();
    loss = local.detach();
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : params)
    grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  torch::Tensor flat = torch::cat(grads);
  comm_->all_reduce(flat);  // the sum of the ranks' shares: the global mean's gradient
  comm_->all_reduce(loss);

  // AdamW on the owned slices (torch.optim.AdamW's arithmetic, decoupled weight decay).
  const OptimConfig& oc = config_.optim;
  const double lr = warmup_cosine_lr(oc, schedule_step, config_.total_steps);
  optimizer_step += 1;
  const double bc1 = 1 - std::pow(oc.beta1, static_cast<double>(optimizer_step));
  const double bc2 = 1 - std::pow(oc.beta2, static_cast<double>(optimizer_step));
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Range& own = owned[i];
    torch::Tensor g = flat.narrow(0, offset + own.begin, own.size());
    torch::Tensor p = params[i].detach().view({-1}).narrow(0, own.begin, own.size());
    exp_avg[i].mul_(oc.beta1).add_(g, 1 - oc.beta1);
    exp_avg_sq[i].mul_(oc.beta2).addcmul_(g, g, 1 - oc.beta2);
    torch::Tensor denom = (exp_avg_sq[i].sqrt() / std::sqrt(bc2)).add_(oc.eps);
    p.mul_(1 - lr * oc.weight_decay);
    p.addcdiv_(exp_avg[i], denom, -lr / bc1);
    offset += params[i].numel();
  }
  gather_params();
  schedule_step += 1;
  data_position += B;
  return loss.item<float>();
}

// ---------------------------------------------------------------- CRC-32, dtypes

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

namespace {
const std::vector<std::pair<torch::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, const char*>> names = {
      {torch::kFloat32, "F32"}, {torch::kFloat64, "F64"}, {torch::kFloat16, "F16"},
      {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"}, {torch::kInt32, "I32"},
      {torch::kInt16, "I16"},   {torch::kInt8, "I8"},     {torch::kUInt8, "U8"},
      {torch::kBool, "BOOL"}};
  return names;
}
}  // namespace

std::string safetensors_dtype(torch::ScalarType t) {
  for (const auto& [type, name] : dtype_names())
    if (type == t) return name;
  throw Error(fmt::format("safetensors_dtype: dtype {} has no safetensors name", c10::toString(t)));
}

torch::ScalarType dtype_from_safetensors(const std::string& s) {
  for (const auto& [type, name] : dtype_names())
    if (s == name) return type;
  throw Error(fmt::format("dtype_from_safetensors: unknown dtype '{}'", s));
}

// ---------------------------------------------------------------- strings over a Comm

std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine) {
  const int n = comm.size();
  auto cpu = torch::TensorOptions().dtype(torch::kInt64).device(comm.device());
  torch::Tensor lengths = torch::zeros({n}, cpu);
  comm.all_gather(lengths, torch::full({1}, static_cast<int64_t>(mine.size()), cpu));
  torch::Tensor len_host = lengths.cpu();
  const int64_t longest = std::max<int64_t>(1, len_host.max().item<int64_t>());
  torch::Tensor buf = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  torch::Tensor all = torch::empty({n * longest}, torch::TensorOptions().dtype(torch::kUInt8).device(comm.device()));
  comm.all_gather(all, buf.to(comm.device()));
  torch::Tensor host = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.emplace_back(static_cast<const char*>(host.data_ptr()) + r * longest,
                     static_cast<size_t>(len_host[r].item<int64_t>()));
  return out;
}

// ---------------------------------------------------------------- BackgroundWorker

BackgroundWorker::BackgroundWorker() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;  // stop, nothing queued
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      error_ = err;
      running_ = false;
      cv_.notify_all();
    }
  });
}

BackgroundWorker::~BackgroundWorker() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !running_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundWorker::submit(std::function<void()> job) {
  wait();
  std::lock_guard<std::mutex> lock(mu_);
  job_ = std::move(job);
  running_ = true;
  cv_.notify_all();
}

void BackgroundWorker::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !running_; });
  if (error_) {
    std::exception_ptr err = error_;
    error_ = nullptr;
    std::rethrow_exception(err);
  }
}

bool BackgroundWorker::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

// ---------------------------------------------------------------- fault injection

void fault_point(const char* where, int64_t step) {
  static const std::string spec = [] {
    const char* v = std::getenv("DTL_LAB17_FAULT");
    return std::string(v ? v : "");
  }();
  if (spec.empty()) return;
  std::map<std::string, std::string> kv;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  const int rank = Runtime::exists() ? Runtime::get().rank() : 0;
  if (kv["at"] == where && kv["rank"] == std::to_string(rank) && kv["step"] == std::to_string(step)) {
    std::fprintf(stderr, "[rank %d] fault injection: SIGKILL at '%s' of step %lld\n", rank, where,
                 static_cast<long long>(step));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

// ---------------------------------------------------------------- the checkpointed loop

RunResult train_with_checkpoints(const RunConfig& config, Comm& comm) {
  RunResult result;
  Trainer trainer(config.train, comm);
  Snapshot state = state_of(trainer);
  if (!latest(config.dir).empty()) {
    LoadOptions opts;
    opts.allow_reshard = true;
    const LoadResult loaded = load(config.dir, state, comm, opts);
    restore(trainer, state, loaded);
    result.resumed_from = loaded.step;
    result.resharded = loaded.resharded;
  }
  SaveOptions save_opts;
  save_opts.keep_last = config.keep_last;
  std::unique_ptr<AsyncSaver> saver;
  if (config.async) saver = std::make_unique<AsyncSaver>(comm);
  while (trainer.schedule_step < config.train.total_steps) {
    Timer step_timer;
    result.losses.push_back(trainer.train_step());
    result.step_seconds += step_timer.seconds();
    const int64_t s = trainer.schedule_step;
    if (s % config.save_every == 0 || s == config.train.total_steps) {
      Timer save_timer;
      if (saver)
        saver->save(config.dir, state_of(trainer), save_opts);
      else
        save(config.dir, state_of(trainer), comm, save_opts);
      result.save_seconds += save_timer.seconds();
    }
  }
  if (saver) {
    Timer save_timer;
    saver->wait();
    result.save_seconds += save_timer.seconds();
  }
  result.final_params = trainer.flat_params();
  return result;
}

}  // namespace dtl::lab17
