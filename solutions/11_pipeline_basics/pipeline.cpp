// solutions/11_pipeline_basics/pipeline.cpp — reference solution of lab 11.
//
// Read it in this order: partition (where to cut: a small dynamic program), imbalance, the
// stage's forward and backward (the only communication: one activation forward and one
// gradient back per stage boundary and micro-batch), then the fill-drain step that strings them
// together and reconciles the tied embedding.
#include "pipeline.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt >= 11 declares it here only)

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtl/error.hpp"
#include "dtl/timer.hpp"  // defines: DeviceTimer
#include "stage_state.hpp"

namespace dtl::lab11 {

// ---------------------------------------------------------------- Task 1

// Minimise the largest stage cost over contiguous cuts. best[k][i] = the smallest possible
// "largest stage" when the first i units form k stages; the last of those stages is units
// [j, i) for some j, so best[k][i] = min over j of max(best[k-1][j], cost(j..i)). O(p n^2) for n
// units and p stages: nothing for the hundred-odd layers of a real model. (Binary search on the
// answer with a greedy check is the other classic solution.)
std::vector<Range> partition(const std::vector<double>& costs, int stages) {
  const int64_t n = static_cast<int64_t>(costs.size());
  DTL_CHECK(stages >= 1, fmt::format("partition: stages={} must be at least 1", stages));
  DTL_CHECK(stages <= n,
            fmt::format("partition: more stages than units: stages={} > {} units", stages, n));
  for (int64_t i = 0; i < n; ++i)
    DTL_CHECK(std::isfinite(costs[static_cast<size_t>(i)]) && costs[static_cast<size_t>(i)] >= 0,
              fmt::format("partition: cost of unit {} is {}; costs must be finite and >= 0", i,
                          costs[static_cast<size_t>(i)]));
  std::vector<double> prefix(static_cast<size_t>(n + 1), 0.0);
  for (int64_t i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i + 1)] =
        prefix[static_cast<size_t>(i)] + costs[static_cast<size_t>(i)];
  auto cost = [&](int64_t a, int64_t b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)];
  };

  const double inf = std::numeric_limits<double>::infinity();
  const size_t N = static_cast<size_t>(n + 1);
  std::vector<std::vector<double>> best(static_cast<size_t>(stages + 1),
                                        std::vector<double>(N, inf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(stages + 1),
                                        std::vector<int64_t>(N, -1));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int64_t i = k; i <= n - (stages - k); ++i)  // leave at least one unit per later stage
      for (int64_t j = k - 1; j < i; ++j) {
        const double v =
            std::max(best[static_cast<size_t>(k - 1)][static_cast<size_t>(j)], cost(j, i));
        if (v < best[static_cast<size_t>(k)][static_cast<size_t>(i)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(i)] = v;
          cut[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
  std::vector<Range> parts(static_cast<size_t>(stages));
  int64_t end = n;
  for (int k = stages; k >= 1; --k) {
    const int64_t begin = cut[static_cast<size_t>(k)][static_cast<size_t>(end)];
    parts[static_cast<size_t>(k - 1)] = Range{begin, end};
    end = begin;
  }
  return parts;
}

double imbalance(const std::vector<double>& costs, const std::vector<Range>& parts) {
  const int64_t n = static_cast<int64_t>(costs.size());
  DTL_CHECK(!parts.empty(), "imbalance: the partition has no stages");
  int64_t next = 0;
  double total = 0, slowest = 0;
  for (const Range& r : parts) {
    DTL_CHECK(r.begin == next && r.end > r.begin && r.end <= n,
              fmt::format("imbalance: the partition is not contiguous and non-empty at [{}, {}) "
                          "(expected a run starting at unit {})",
                          r.begin, r.end, next));
    double c = 0;
    for (int64_t u = r.begin; u < r.end; ++u) c += costs[static_cast<size_t>(u)];
    total += c;
    slowest = std::max(slowest, c);
    next = r.end;
  }
  DTL_CHECK(next == n, fmt::format("imbalance: the partition covers {} of {} units", next, n));
  const double mean = total / static_cast<double>(parts.size());
  return mean > 0 ? slowest / mean : 1.0;
}

// ---------------------------------------------------------------- Task 2

torch::Tensor PipelineStage::forward(const torch::Tensor& tokens) {
  State& s = *s_;
  DTL_CHECK(tokens.dim() == 2 && tokens.size(1) >= 2,
            fmt::format("PipelineStage::forward: tokens must be [mb, T + 1], got {}",
                        fmt::join(tokens.sizes(), "x")));
  const int64_t mb = tokens.size(0), T = tokens.size(1) - 1;
  const torch::Tensor toks = tokens.to(s.device);
  State::Saved saved;
  torch::Tensor x;
  if (is_first()) {
    x = toks.narrow(1, 0, T);
  } else {
    // The shape is known without asking: every stage sees the same micro-batch, and every
    // boundary carries the residual stream [mb, T, d].
    saved.input = torch::empty({mb, T, s.cfg.d_model},
                               torch::TensorOptions().dtype(torch::kFloat32).device(s.device));
    s.comm->recv(saved.input, s.stage - 1);
    saved.input.requires_grad_(true);  // a leaf: backward stops here and leaves us its grad
    x = saved.input;
  }
  torch::Tensor out = run_units(x);
  if (is_last()) {
    out = model::lm_loss(out, toks.narrow(1, 1, T));
  } else {
    s.comm->send(out.detach().contiguous(), s.stage + 1);
  }
  saved.output = out;  // keeps the autograd graph (the activations) until backward
  s.saved.emplace(s.next_micro++, std::move(saved));
  s.peak = std::max<int64_t>(s.peak, static_cast<int64_t>(s.saved.size()));
  return is_last() ? out.detach() : torch::Tensor();
}

void PipelineStage::backward(int64_t micro, double loss_scale) {
  State& s = *s_;
  auto it = s.saved.find(micro);
  DTL_CHECK(it != s.saved.end(),
            fmt::format("PipelineStage::backward: micro-batch {} is not in flight on stage {}",
                        micro, s.stage));
  State::Saved saved = std::move(it->second);
  s.saved.erase(it);  // the activations go as soon as this backward is done
  if (is_last()) {
    (saved.output * loss_scale).backward();
  } else {
    // The next stage already scaled its loss: what arrives is d(loss)/d(our output).
    torch::Tensor grad = torch::empty_like(saved.output);
    s.comm->recv(grad, s.stage + 1);
    saved.output.backward(grad);
  }
  if (!is_first()) s.comm->send(saved.input.grad().contiguous(), s.stage - 1);
}

// ---------------------------------------------------------------- Task 3

StepStats fill_drain_step(PipelineStage& stage, torch::optim::Optimizer& optimizer,
                          const torch::Tensor& global_batch, int64_t micro_batches) {
  DTL_CHECK(global_batch.dim() == 2 && global_batch.size(0) >= 1,
            "fill_drain_step: global_batch must be [B, T + 1] with B >= 1");
  const int64_t B = global_batch.size(0), m = micro_batches;
  DTL_CHECK(m >= 1 && B % m == 0,
            fmt::format("fill_drain_step: micro_batches={} must be >= 1 and divide the batch of "
                        "{} rows",
                        m, B));
  const int64_t rows = B / m;
  StepStats st;
  st.micro_batches = m;
  optimizer.zero_grad();

  // Fill: every micro-batch forward. Stage s starts micro-batch 0 only once stages 0..s-1 have
  // run it, so stage s idles for s slots here, and for p-1-s slots at the start of the drain.
  DeviceTimer timer;  // on a GPU the phases end when their kernels did, not when they were queued
  double loss_sum = 0;
  for (int64_t k = 0; k < m; ++k) {
    torch::Tensor loss = stage.forward(global_batch.narrow(0, k * rows, rows));
    if (stage.is_last()) loss_sum += loss.item<double>();
  }
  // Drain: the backwards, newest first (the last stage can start the moment its last forward
  // ends). 1/m makes the accumulated gradient that of the mean over the global batch.
  st.forward_seconds = timer.seconds();
  timer.reset();
  for (int64_t k = m - 1; k >= 0; --k) stage.backward(k, 1.0 / static_cast<double>(m));
  st.backward_seconds = timer.seconds();
  st.peak_in_flight = stage.peak_in_flight();

  // The tied embedding lives on the first stage (input) and the last (head): each saw only its
  // own use of it. The serial gradient is the sum of both, so both holders add them up and
  // then take identical optimizer steps, as Megatron-LM does in its embedding group.
  if (Comm* group = stage.embedding_group()) {
    for (auto& [name, p] : stage.named_parameters())
      if (name == "wte.weight") group->all_reduce(p.mutable_grad());
  }
  optimizer.step();
  stage.finish_step();

  // Only the last stage computed the loss; every stage reports it.
  torch::Tensor loss = torch::full({1}, loss_sum / static_cast<double>(m),
                                   torch::TensorOptions()
                                       .dtype(torch::kFloat64)
                                       .device(stage.module().parameters().front().device()));
  stage.comm().broadcast(loss, stage.num_stages() - 1);
  st.loss = loss.item<double>();
  return st;
}

}  // namespace dtl::lab11
