// ddp.cpp — lab 04 reference solution: a DistributedDataParallel built like PyTorch's Reducer.
//
//   construction:  verify (fingerprints, all_gather) -> broadcast from rank 0 -> buckets -> hooks
//
//   backward, time flows down; autograd produces gradients from the loss backwards:
//
//     autograd thread                      comm worker (dtl::Comm, in issue order)
//     ln_f grads ready  -> copy/n into B0
//     block 1 grads     -> copy/n into B0   B0 full: issue all_reduce(B0) ──> runs now, while
//     block 0 grads     -> copy/n into B1                                      autograd goes on
//     wte grad (last)   -> copy/n into B1   B1 full: issue all_reduce(B1) ──> runs after B0
//     end of backward   -> wait B0, B1; copy averaged grads back into .grad()
//
//   Only the last bucket's all-reduce cannot hide under compute; that is why bucket 0 is small
//   (communication starts early) and why buckets are few (each all-reduce pays the latency).
#include "ddp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt >= 11 declares it here only)

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace dtl::lab04 {

// ---------------------------------------------------------------- Task 1: the bucket rule

std::vector<std::vector<int64_t>> assign_buckets(const std::vector<int64_t>& param_bytes,
                                                 int64_t first_bucket_bytes,
                                                 int64_t bucket_cap_bytes) {
  DTL_CHECK(first_bucket_bytes > 0,
            fmt::format("assign_buckets: first_bucket_bytes={} must be > 0", first_bucket_bytes));
  DTL_CHECK(bucket_cap_bytes > 0,
            fmt::format("assign_buckets: bucket_cap_bytes={} must be > 0", bucket_cap_bytes));
  for (size_t i = 0; i < param_bytes.size(); ++i)
    DTL_CHECK(param_bytes[i] >= 0,
              fmt::format("assign_buckets: param_bytes[{}]={} must be >= 0", i, param_bytes[i]));

  std::vector<std::vector<int64_t>> buckets;
  std::vector<int64_t> open;
  int64_t open_bytes = 0;
  // Walk from the output side: the last registered parameters get their gradients first.
  for (int64_t i = static_cast<int64_t>(param_bytes.size()) - 1; i >= 0; --i) {
    open.push_back(i);
    open_bytes += param_bytes[i];
    const int64_t cap = buckets.empty() ? first_bucket_bytes : bucket_cap_bytes;
    if (open_bytes >= cap) {  // >=, as reducer.cpp: a bucket closes the moment it is full
      buckets.push_back(std::move(open));
      open.clear();
      open_bytes = 0;
    }
  }
  if (!open.empty()) buckets.push_back(std::move(open));
  return buckets;
}

// ---------------------------------------------------------------- Task 2: same model everywhere

namespace {

// FNV-1a: a stable 64-bit fingerprint of a tensor's description. Never 0, which marks "this
// rank has no tensor at that position".
int64_t fingerprint(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h | 1);
}

std::string describe(const char* kind, const std::string& name, const torch::Tensor& t) {
  return fmt::format("{} {}: {}[{}]{}", kind, name, c10::toString(t.scalar_type()),
                     fmt::join(t.sizes(), ", "), t.requires_grad() ? " requires_grad" : "");
}

}  // namespace

void verify_model_across_ranks(torch::nn::Module& module, Comm& comm) {
  // What each rank has, in registration order: parameters, then buffers.
  std::vector<std::string> names, descriptions;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    names.push_back(p.key());
    descriptions.push_back(describe("parameter", p.key(), p.value()));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    names.push_back(b.key());
    descriptions.push_back(describe("buffer", b.key(), b.value()));
  }
  const int n = comm.size();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(comm.device());

  // Round 1: how many tensors each rank has. Everything after depends only on gathered values,
  // so every rank issues the same collectives and reaches the same verdict: nobody hangs.
  torch::Tensor counts = torch::empty({n}, i64);
  comm.all_gather(counts, torch::full({1}, static_cast<int64_t>(names.size()), i64));
  const std::vector<int64_t> count = [&] {
    torch::Tensor c = counts.cpu();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + n);
  }();
  const int64_t width = *std::max_element(count.begin(), count.end());
  if (width == 0) return;

  // Round 2: one fingerprint per tensor (0 where a rank has fewer), not the weights.
  std::vector<int64_t> mine(static_cast<size_t>(width), 0);
  for (size_t i = 0; i < descriptions.size(); ++i) mine[i] = fingerprint(descriptions[i]);
  torch::Tensor all = torch::empty({n * width}, i64);
  comm.all_gather(all, torch::tensor(mine, torch::kInt64).to(comm.device()));
  torch::Tensor table = all.cpu().view({n, width});
  const torch::Tensor differs = table.ne(table[0].unsqueeze(0));  // [n, width] vs rank 0
  const torch::Tensor columns = differs.any(0).nonzero();
  if (columns.numel() == 0) return;
  const int64_t first = columns[0][0].item<int64_t>();
  std::vector<int> bad_ranks;
  for (int r = 0; r < n; ++r)
    if (differs[r][first].item<bool>()) bad_ranks.push_back(r);

  // Round 3: the human-readable description of that one position, from every rank.
  constexpr int64_t kText = 256;
  std::string text = first < static_cast<int64_t>(descriptions.size())
                         ? descriptions[first]
                         : fmt::format("(nothing: this rank has only {} parameters and buffers)",
                                       descriptions.size());
  text.resize(kText, '\0');
  torch::Tensor out = torch::empty({n * kText}, i64.dtype(torch::kUInt8));
  torch::Tensor in = torch::from_blob(text.data(), {kText}, torch::kUInt8).to(comm.device());
  comm.all_gather(out, in);
  torch::Tensor texts = out.cpu().contiguous();
  auto text_of = [&](int r) {
    const char* p = reinterpret_cast<const char*>(texts.data_ptr<uint8_t>()) + r * kText;
    return std::string(p, strnlen(p, kText));
  };
  // Name the tensor after a rank that has it (rank 0 may be the one with fewer tensors).
  std::string name;
  for (int r = 0; r < n && name.empty(); ++r) {
    const std::string t = text_of(r);
    if (t.rfind("parameter ", 0) == 0 || t.rfind("buffer ", 0) == 0)
      name = t.substr(t.find(' ') + 1, t.find(':') - t.find(' ') - 1);
  }
  std::string per_rank = fmt::format("rank 0 has '{}'", text_of(0));
  for (int r : bad_ranks) per_rank += fmt::format(", rank {} has '{}'", r, text_of(r));
  throw Error(fmt::format(
      "DistributedDataParallel: the model differs across ranks at '{}' (tensor #{} in "
      "registration order): {}; ranks [{}] disagree with rank 0. Build the same model on every "
      "rank.",
      name, first, per_rank, fmt::join(bad_ranks, ",")));
}

// ---------------------------------------------------------------- the wrapper's state

struct DistributedDataParallel::State {
  DistributedDataParallel* self = nullptr;  // for require_sync_ (no_sync)
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<Comm> comm;
  DDPOptions options;

  std::vector<torch::Tensor> params;  // managed parameters, registration order
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> bucket_params;  // buckets()

  struct Bucket {
    torch::Tensor flat;   // the gradients of its parameters, back to back
    int64_t pending = 0;  // parameters not yet ready in this backward
    Work work;            // its all-reduce, once issued
  };
  std::vector<Bucket> buckets;
  std::vector<int64_t> bucket_of;     // parameter -> its bucket
  std::vector<torch::Tensor> slot;    // parameter -> its slice of the bucket buffer
  std::vector<std::unique_ptr<GradReadyHook>> hooks;
  double inv_world = 1.0;

  // Per synchronised backward.
  std::mutex mu;                // hooks run on autograd's thread(s): one at a time here
  bool in_backward = false;     // the end-of-backward callback is queued
  size_t next_to_issue = 0;     // buckets [0, next_to_issue) are issued
  std::vector<char> ready;      // got its gradient in this backward
  std::vector<char> used;       // got a gradient since the last synchronisation (no_sync too)

  void on_grad_ready(size_t i);
  void start_backward();
  void copy_into_bucket(size_t i, bool has_gradient);
  void issue_ready_buckets();
  void finish_backward();
};

// Copies parameter i's gradient, divided by the world size, into its bucket slot. Dividing
// while copying is one pass over the memory; and pre-dividing keeps a Sum of n fp16 gradients
// from overflowing where the sum of the raw gradients would.
void DistributedDataParallel::State::copy_into_bucket(size_t i, bool has_gradient) {
  torch::NoGradGuard no_grad;
  torch::Tensor& grad = params[i].mutable_grad();
  torch::Tensor& view = slot[i];
  if (!has_gradient || !grad.defined()) {
    view.zero_();  // nothing this rank can add: zeros keep the sum right
  } else if (grad.data_ptr() == view.data_ptr()) {
    view.mul_(inv_world);  // gradient_as_bucket_view: autograd accumulated into the slot itself
  } else {
    torch::mul_out(view, grad, torch::scalar_tensor(inv_world, grad.options().device(torch::kCPU)));
    // gradient_as_bucket_view with a .grad() that is not the slot (first backward, or an
    // optimizer that reset grads to undefined): from now on .grad() IS the slot.
    if (options.gradient_as_bucket_view) grad = view;
  }
  ready[i] = 1;
  --buckets[static_cast<size_t>(bucket_of[i])].pending;
}

// Issues every complete bucket from next_to_issue on, stopping at the first incomplete one.
// Strict bucket order is what keeps the ranks paired: rank A's k-th all-reduce on this Comm
// must be the same bucket as rank B's k-th, whatever order the gradients arrived in.
void DistributedDataParallel::State::issue_ready_buckets() {
  while (next_to_issue < buckets.size() && buckets[next_to_issue].pending == 0) {
    Bucket& b = buckets[next_to_issue++];
    b.work = comm->all_reduce_async(b.flat, ReduceOp::Sum);  // returns at once
  }
}

void DistributedDataParallel::State::start_backward() {
  in_backward = true;
  next_to_issue = 0;
  std::fill(ready.begin(), ready.end(), 0);
  for (size_t b = 0; b < buckets.size(); ++b)
    buckets[b].pending = static_cast<int64_t>(bucket_params[b].size());
  // Runs after autograd computed the last gradient of this backward, before backward() returns.
  queue_end_of_backward([this] { finish_backward(); });
}

void DistributedDataParallel::State::on_grad_ready(size_t i) {
  std::lock_guard<std::mutex> lock(mu);
  used[i] = 1;
  if (!self->require_sync()) return;  // no_sync: autograd already accumulated into .grad()
  if (!in_backward) start_backward();
  if (ready[i]) {
    in_backward = false;
    throw Error(fmt::format("DistributedDataParallel: parameter '{}' got its gradient twice in "
                            "one backward (ready twice)", names[i]));
  }
  copy_into_bucket(i, /*has_gradient=*/true);
  issue_ready_buckets();
}

void DistributedDataParallel::State::finish_backward() {
  std::lock_guard<std::mutex> lock(mu);
  in_backward = false;
  // 1. Parameters whose hook did not run: ready now. One used only under no_sync has an
  //    accumulated .grad() to contribute; one not used at all contributes zeros.
  std::string first_unused;
  for (size_t i = 0; i < params.size(); ++i) {
    if (ready[i]) continue;
    if (!used[i] && first_unused.empty()) first_unused = names[i];
    copy_into_bucket(i, /*has_gradient=*/used[i] != 0);
  }
  issue_ready_buckets();  // every bucket is complete now: issue the rest, in order
  // 2. Which parameters did ANY rank use? (find_unused_parameters only: PyTorch's
  //    local_used_map.) Issued after the last bucket, so it never delays one.
  torch::Tensor usage;
  Work usage_work;
  if (options.find_unused_parameters) {
    usage = torch::tensor(std::vector<int32_t>(used.begin(), used.end()), torch::kInt32)
                .to(comm->device());
    usage_work = comm->all_reduce_async(usage, ReduceOp::Sum);
  }
  // 3. Wait: the only communication that is not hidden under backward is what is still in
  //    flight now, mostly the last bucket.
  for (Bucket& b : buckets) b.work.wait();
  std::vector<int32_t> users(params.size(), 1);
  if (options.find_unused_parameters) {
    usage_work.wait();
    torch::Tensor u = usage.cpu();
    users.assign(u.data_ptr<int32_t>(), u.data_ptr<int32_t>() + u.numel());
  }
  // 4. Averaged gradients into .grad().
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (users[i] == 0) continue;  // nobody used it: leave .grad() as serial training would
    torch::Tensor& grad = params[i].mutable_grad();
    if (options.gradient_as_bucket_view) {
      if (!grad.defined() || grad.data_ptr() != slot[i].data_ptr()) grad = slot[i];
    } else if (grad.defined()) {
      grad.copy_(slot[i]);
    } else {
      grad = slot[i].clone();  // must not alias the bucket, which the next backward overwrites
    }
  }
  std::fill(used.begin(), used.end(), 0);  // a new accumulation window starts
  if (!options.find_unused_parameters && !first_unused.empty())
    throw Error(fmt::format(
        "DistributedDataParallel: parameter '{}' got no gradient in this backward; pass "
        "find_unused_parameters = true if some parameters are legitimately unused",
        first_unused));
}

// ---------------------------------------------------------------- Task 3: construction

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 Comm& comm, DDPOptions options)
    : state_(std::make_unique<State>()) {
  DTL_CHECK(module != nullptr, "DistributedDataParallel: module is null");
  State& s = *state_;
  s.self = this;
  s.module = std::move(module);
  s.comm = comm.shared_from_this();
  s.options = options;
  s.inv_world = 1.0 / comm.size();

  // Managed parameters: each tensor once, trainable only (PyTorch's _build_params_for_reducer).
  std::unordered_set<const void*> seen;
  for (const auto& p : s.module->named_parameters(/*recurse=*/true)) {
    const torch::Tensor& t = p.value();
    if (!seen.insert(t.unsafeGetTensorImpl()).second || !t.requires_grad()) continue;
    s.params.push_back(t);
    s.names.push_back(p.key());
  }

  // 1. Same model everywhere (collective: before any check that only one rank could fail).
  verify_model_across_ranks(*s.module, comm);
  DTL_CHECK(!s.params.empty(), "DistributedDataParallel: the module has no parameter that "
                               "requires grad");
  for (size_t i = 0; i < s.params.size(); ++i) {
    DTL_CHECK(s.params[i].device() == comm.device(),
              fmt::format("DistributedDataParallel: parameter '{}' is on device {} but comm '{}' "
                          "moves {} tensors",
                          s.names[i], s.params[i].device().str(), comm.name(),
                          comm.device().str()));
    DTL_CHECK(s.params[i].scalar_type() == s.params[0].scalar_type(),
              fmt::format("DistributedDataParallel: parameter '{}' has dtype {} but '{}' has {}: "
                          "one dtype for all parameters",
                          s.names[i], c10::toString(s.params[i].scalar_type()), s.names[0],
                          c10::toString(s.params[0].scalar_type())));
  }

  // 2. Rank 0's values everywhere: parameters (frozen too) and buffers, coalesced per dtype
  //    into one flat tensor each, so it is a few broadcasts, not one per tensor.
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> states;
    for (const auto& p : s.module->parameters(true)) states.push_back(p);
    for (const auto& b : s.module->buffers(true)) states.push_back(b);
    std::vector<torch::ScalarType> dtypes;
    for (const auto& t : states)
      if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end())
        dtypes.push_back(t.scalar_type());
    for (torch::ScalarType dtype : dtypes) {
      std::vector<torch::Tensor> group;
      for (const auto& t : states)
        if (t.scalar_type() == dtype) group.push_back(t.reshape({-1}));
      torch::Tensor flat = torch::cat(group).to(comm.device());
      comm.broadcast(flat, 0);
      int64_t offset = 0;
      for (auto& t : states) {
        if (t.scalar_type() != dtype) continue;
        t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
    }
  }

  // 3. Buckets over the gradient bytes, and each parameter's slot in its bucket's buffer.
  std::vector<int64_t> bytes;
  for (const auto& p : s.params) bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
  s.bucket_params = assign_buckets(bytes, options.first_bucket_bytes, options.bucket_cap_bytes);
  s.bucket_of.assign(s.params.size(), -1);
  s.slot.resize(s.params.size());
  s.buckets.resize(s.bucket_params.size());
  for (size_t b = 0; b < s.bucket_params.size(); ++b) {
    int64_t numel = 0;
    for (int64_t i : s.bucket_params[b]) numel += s.params[static_cast<size_t>(i)].numel();
    s.buckets[b].flat = torch::zeros({numel}, s.params[0].options().requires_grad(false));
    int64_t offset = 0;
    for (int64_t i : s.bucket_params[b]) {
      const torch::Tensor& p = s.params[static_cast<size_t>(i)];
      s.bucket_of[static_cast<size_t>(i)] = static_cast<int64_t>(b);
      s.slot[static_cast<size_t>(i)] = bucket_view(s.buckets[b].flat, offset, p.sizes());
      offset += p.numel();
    }
  }
  s.ready.assign(s.params.size(), 0);
  s.used.assign(s.params.size(), 0);

  // 4. gradient_as_bucket_view: existing gradients move into their slots now.
  if (options.gradient_as_bucket_view) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < s.params.size(); ++i) {
      torch::Tensor& grad = s.params[i].mutable_grad();
      if (!grad.defined()) continue;
      s.slot[i].copy_(grad);
      grad = s.slot[i];
    }
  }

  // 5. Hooks last: nothing above runs a backward, and a half-built wrapper must not be called.
  State* state = state_.get();
  for (size_t i = 0; i < s.params.size(); ++i)
    s.hooks.push_back(
        std::make_unique<GradReadyHook>(s.params[i], [state, i] { state->on_grad_ready(i); }));
}

DistributedDataParallel::~DistributedDataParallel() {
  if (!state_) return;
  state_->hooks.clear();  // first: no hook may run into a dying State
  for (auto& b : state_->buckets) {
    try {
      b.work.wait();  // an all-reduce still in flight (a backward that threw) uses b.flat
    } catch (...) {
    }
  }
}

torch::nn::Module& DistributedDataParallel::module() const { return *state_->module; }
Comm& DistributedDataParallel::comm() const { return *state_->comm; }
const DDPOptions& DistributedDataParallel::options() const { return state_->options; }
const std::vector<torch::Tensor>& DistributedDataParallel::parameters() const {
  return state_->params;
}
const std::vector<std::string>& DistributedDataParallel::parameter_names() const {
  return state_->names;
}
const std::vector<std::vector<int64_t>>& DistributedDataParallel::buckets() const {
  return state_->bucket_params;
}

}  // namespace dtl::lab04
