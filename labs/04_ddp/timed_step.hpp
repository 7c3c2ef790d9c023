// labs/04_ddp/timed_step.hpp — one timed training step, naive or DDP, for the demo (main.cpp)
// and the benchmark (bench.cpp). Not student code: the frame that measures it.
//
// What is measured, per rank, from the trace (dtl/trace.hpp; tracing must be on):
//   compute  forward + backward + optimizer. Backward ends when autograd reaches the
//            embedding output (a hook marks it): after that only the embedding's own gradient
//            is left, and with DDP, backward() goes on WAITING for the buckets, which is not
//            compute. So DDP's wait is not hidden inside a "backward" bar.
//   comm     the union of the Comm's op intervals (worker start to finish; under the network
//            emulator this includes waiting for the slowest rank to arrive)
//   exposed  comm time not under compute: what overlap has not hidden
#pragma once

#include <torch/torch.h>

#include "ddp.hpp"
#include "dtl/comm.hpp"
#include "dtl/model.hpp"
#include "dtl/log.hpp"    // defines: log_rank
#include "dtl/perf.hpp"   // defines: max_over_ranks
#include "dtl/trace.hpp"  // defines: DTL_SCOPE, trace::record, trace::summary

namespace dtl::lab04 {

struct StepTimes {
  double step = 0, compute = 0, comm = 0, exposed = 0;  // seconds, this rank
  double loss = 0;
};

// zero_grad, forward and backward on `tokens` (this rank's rows, [b, T + 1]), then for the
// naive baseline one blocking all-reduce per parameter (lab 02's method: each rank's gradient
// / world, Sum), then the optimizer. With DDP, the wrapper's hooks do the communication inside
// backward(). Equal shards assumed (the demo and the bench use a batch divisible by world).
inline StepTimes timed_step(model::GPT& model, torch::optim::Optimizer& optimizer,
                            const torch::Tensor& tokens, Comm& comm, bool naive) {
  const double start = trace::now();
  optimizer.zero_grad();
  const int64_t T = tokens.size(1) - 1;
  torch::Tensor loss;
  double backward_end = 0;  // set by the hook below, inside backward()
  {
    DTL_SCOPE("forward");
    torch::Tensor x = model->embed(tokens.narrow(1, 0, T));
    x.register_hook([&backward_end](const torch::Tensor& g) {
      backward_end = trace::now();  // backward's compute ends here (see the file comment)
      return g;
    });
    for (int64_t l = 0; l < model->config().n_layer; ++l) x = model->block(l)->forward(x);
    loss = model::lm_loss(model->head(x), tokens.narrow(1, 1, T));
  }
  const double backward_start = trace::now();
  loss.backward();
  trace::Event bar;  // the backward bar of the timeline: from its start to the marker
  bar.name = "backward";
  bar.track = "compute";
  bar.cat = "compute";
  bar.start = backward_start;
  bar.end = backward_end;
  bar.rank = log_rank();  // the world rank: one timeline row per process
  trace::record(bar);
  if (naive) {
    const double inv = 1.0 / comm.size();
    for (auto& p : model->parameters()) {
      if (!p.requires_grad()) continue;
      comm.all_reduce(p.mutable_grad());
      p.mutable_grad().mul_(inv);
    }
  }
  {
    DTL_SCOPE("optimizer");
    optimizer.step();
  }
  const double end = trace::now();
  const trace::Summary s = trace::summary(trace::events(), start, end);
  StepTimes t;
  t.step = end - start;
  t.compute = s.compute;
  t.comm = s.comm;
  t.exposed = s.exposed_comm;
  t.loss = loss.item<double>();
  return t;
}

// The step as the job sees it (collective: every rank calls it): the step time of the slowest
// rank, and compute / comm / exposed comm of the rank with the most compute, the critical path.
// (On a faster rank, waiting for the slow one's gradients shows up as exposed comm although
// the step would not be shorter without it: load imbalance, not communication.)
inline StepTimes critical_path(const StepTimes& mine) {
  StepTimes t;
  t.step = max_over_ranks(mine.step);
  t.compute = max_over_ranks(mine.compute);
  const bool slowest = mine.compute == t.compute;
  t.comm = max_over_ranks(slowest ? mine.comm : 0.0);
  t.exposed = max_over_ranks(slowest ? mine.exposed : 0.0);
  t.loss = mine.loss;
  return t;
}

// The default workload of the demo and the benchmark: 4 blocks of width 192 (52 tensors,
// 6.9 MiB of float32 gradients) and a global batch of 128 x 64 tokens, enough backward compute
// per rank for the buckets' all-reduces to hide under on the emulated PCIe network.
inline model::GPTConfig demo_config() {
  model::GPTConfig c;
  c.vocab_size = 128;
  c.seq_len = 64;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 192;
  return c;
}
constexpr int64_t kDemoBatch = 128;
// Bucket caps for that model: PyTorch's 1 MiB first bucket, and a 1 MiB cap, which cuts the
// 6.9 MiB into 7 buckets (PyTorch's 25 MiB is sized for models of hundreds of MB: here it
// would make one bucket that completes only when backward ends).
constexpr int64_t kDemoFirstBucketBytes = int64_t{1} << 20;
constexpr int64_t kDemoBucketCapBytes = int64_t{1} << 20;

}  // namespace dtl::lab04
