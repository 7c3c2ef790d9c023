// solutions/12_pipeline_schedules/pipeline_schedules.cpp — reference solution of lab 12.
//
// Read it in this order: the generators (each schedule is a few lines once you see its shape:
// warm-up forwards, alternating forward/backward, drain), the simulator (list scheduling of
// each rank's actions against their data dependencies, which is also how deadlocks are found),
// and the executor (the same loop with real tensors: receive, compute, send asynchronously).
#include "pipeline_schedules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <tuple>

#include "dtl/error.hpp"
#include "dtl/timer.hpp"
#include "dtl/trace.hpp"

namespace dtl::lab12 {
namespace {

void check_sizes(int p, int64_t m) {
  DTL_CHECK(p >= 1, fmt::format("pipeline schedule: p={} ranks must be >= 1", p));
  DTL_CHECK(m >= 1, fmt::format("pipeline schedule: m={} micro-batches must be >= 1", m));
}

Action fwd(int64_t micro, int chunk = 0) { return {Action::Forward, micro, chunk}; }
Action bwd(int64_t micro, int chunk = 0) { return {Action::Backward, micro, chunk}; }

}  // namespace

// ---------------------------------------------------------------- Task 1

Schedule gpipe(int p, int64_t m) {
  check_sizes(p, m);
  Schedule s(static_cast<size_t>(p));
  for (auto& actions : s) {
    for (int64_t k = 0; k < m; ++k) actions.push_back(fwd(k));
    for (int64_t k = 0; k < m; ++k) actions.push_back(bwd(k));
  }
  return s;
}

Schedule one_f_one_b(int p, int64_t m) { return interleaved(p, m, 1); }

Schedule interleaved(int p, int64_t m, int v) {
  check_sizes(p, m);
  DTL_CHECK(v >= 1, fmt::format("interleaved schedule: v={} chunks per rank must be >= 1", v));
  // Megatron's grouping needs whole groups of p micro-batches per chunk (v = 1 needs nothing).
  DTL_CHECK(
      v == 1 || m % p == 0,
      fmt::format("interleaved schedule: m={} micro-batches must be a multiple of p={}", m, p));
  const int64_t total = m * v, group = static_cast<int64_t>(p) * v;
  // The k-th forward (backward) of every rank: groups of p micro-batches go through chunk 0,
  // 1, ... in forward and v-1, ..., 0 in backward. The same on every rank, so the ranks' sends
  // and receives line up in the same order.
  auto forward_at = [&](int64_t k) {
    return fwd((k / group) * p + k % p, static_cast<int>((k % group) / p));
  };
  auto backward_at = [&](int64_t k) {
    return bwd((k / group) * p + k % p, v - 1 - static_cast<int>((k % group) / p));
  };
  Schedule s(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    // Warm-up: enough forwards that the first backward (of the last virtual stage) can arrive
    // without this rank idling; rank r is p - r - 1 hops from the last stage, and in the
    // interleaved case a micro-batch also loops around (v - 1) more times.
    int64_t warmup =
        v == 1   ? std::min<int64_t>(p - r - 1, m)
        : m == p ? total
                 : std::min<int64_t>((p - r - 1) * 2 + static_cast<int64_t>(v - 1) * p, total);
    std::vector<Action>& actions = s[static_cast<size_t>(r)];
    for (int64_t k = 0; k < warmup; ++k) actions.push_back(forward_at(k));
    // Steady state: one forward, one backward: at most `warmup + 1` in flight from here on.
    const int64_t steady = total - warmup;
    for (int64_t i = 0; i < steady; ++i) {
      actions.push_back(forward_at(warmup + i));
      actions.push_back(backward_at(i));
    }
    for (int64_t i = steady; i < total; ++i) actions.push_back(backward_at(i));  // drain
  }
  return s;
}

// ---------------------------------------------------------------- Task 2

namespace {

using Key = std::tuple<int, int64_t, int>;  // (kind, micro, virtual stage)

// m from the schedule, and every rank's list checked: each (kind, micro, chunk) exactly once.
int64_t check_schedule(const Schedule& schedule, int v) {
  DTL_CHECK(!schedule.empty(), "pipeline schedule: no ranks");
  DTL_CHECK(v >= 1, fmt::format("pipeline schedule: v={} must be >= 1", v));
  // m: the largest micro-batch index of any rank, plus one (a missing or extra action on one
  // rank then shows as exactly that, not as every other action being out of range).
  int64_t m = 0;
  for (const auto& actions : schedule)
    for (const Action& a : actions) m = std::max(m, a.micro + 1);
  DTL_CHECK(m >= 1, "pipeline schedule: no action");
  for (size_t r = 0; r < schedule.size(); ++r) {
    std::map<std::tuple<int, int64_t, int>, int> seen;
    for (const Action& a : schedule[r]) {
      DTL_CHECK(a.micro >= 0 && a.micro < m && a.chunk >= 0 && a.chunk < v,
                fmt::format("pipeline schedule: rank {}: {} is outside m={} micro-batches x v={} "
                            "chunks",
                            r, describe(a, v), m, v));
      const int times = ++seen[std::make_tuple(static_cast<int>(a.kind), a.micro, a.chunk)];
      DTL_CHECK(times == 1,
                fmt::format("pipeline schedule: rank {}: {} is repeated", r, describe(a, v)));
    }
    for (int kind : {Action::Forward, Action::Backward})
      for (int64_t k = 0; k < m; ++k)
        for (int c = 0; c < v; ++c)
          DTL_CHECK(seen.count(std::make_tuple(kind, k, c)) == 1,
                    fmt::format("pipeline schedule: rank {}: {} is missing", r,
                                describe({static_cast<Action::Kind>(kind), k, c}, v)));
  }
  return m;
}

// Messages on a link match in order: the k-th tensor rank r sends on a link is the k-th its
// neighbour receives there. Lists with a different order would pair the wrong micro-batches (or,
// with sends that wait for their receiver, hang), so they are rejected before any communication.
void check_link_order(const Schedule& schedule, int v) {
  const int p = static_cast<int>(schedule.size()), last = p * v - 1;
  if (p == 1) return;
  using Msg = std::pair<int64_t, int>;  // (micro, virtual stage of the sender)
  std::vector<std::vector<Msg>> act_sent(p), act_recv(p), grad_sent(p), grad_recv(p);
  for (int r = 0; r < p; ++r)
    for (const Action& a : schedule[static_cast<size_t>(r)]) {
      const int vs = a.chunk * p + r;
      if (a.kind == Action::Forward) {
        if (vs < last) act_sent[r].push_back({a.micro, vs});
        if (vs > 0) act_recv[r].push_back({a.micro, vs - 1});
      } else {
        if (vs > 0) grad_sent[r].push_back({a.micro, vs});
        if (vs < last) grad_recv[r].push_back({a.micro, vs + 1});
      }
    }
  auto compare = [&](const std::vector<Msg>& sent, const std::vector<Msg>& recv, int from, int to,
                     const char* what) {
    for (size_t i = 0; i < std::min(sent.size(), recv.size()); ++i)
      DTL_CHECK(sent[i] == recv[i],
                fmt::format("execute: the {} on the link {} -> {} are not in the same order on "
                            "both ends: message {} is micro {} of virtual stage {} for rank {} "
                            "but micro {} of virtual stage {} for rank {}",
                            what, from, to, i, sent[i].first, sent[i].second, from, recv[i].first,
                            recv[i].second, to));
  };
  for (int r = 0; r < p; ++r) {
    compare(act_sent[r], act_recv[(r + 1) % p], r, (r + 1) % p, "activations");
    compare(grad_sent[r], grad_recv[(r + p - 1) % p], r, (r + p - 1) % p, "gradients");
  }
}

}  // namespace

SimResult simulate(const Schedule& schedule, int v, const Costs& costs) {
  check_schedule(schedule, v);
  const int p = static_cast<int>(schedule.size());
  const int stages = p * v;
  SimResult res;
  res.busy.assign(static_cast<size_t>(p), 0.0);
  res.peak_in_flight.assign(static_cast<size_t>(p), 0);
  res.start.assign(static_cast<size_t>(p), {});
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<int64_t> in_flight(static_cast<size_t>(p), 0);
  std::map<Key, double> done;  // when each (kind, micro, virtual stage) finished

  // What action `a` of rank r waits for: the key of each input, and the latency to add.
  auto inputs = [&](int r, const Action& a) {
    const int vs = a.chunk * p + r;
    std::vector<std::pair<Key, double>> in;
    auto from = [&](int other_vs) { return other_vs % p == r ? 0.0 : costs.p2p; };
    if (a.kind == Action::Forward) {
      if (vs > 0) in.push_back({{Action::Forward, a.micro, vs - 1}, from(vs - 1)});
    } else {
      in.push_back({{Action::Forward, a.micro, vs}, 0.0});
      if (vs < stages - 1) in.push_back({{Action::Backward, a.micro, vs + 1}, from(vs + 1)});
    }
    return in;
  };

  // List scheduling: a rank runs its next action as soon as the rank is free and the action's
  // inputs are done. Each pass runs every action that can run; a pass that runs none while
  // actions remain is a deadlock (every rank waits for something that waits for it).
  size_t remaining = 0;
  for (const auto& actions : schedule) remaining += actions.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      const auto& actions = schedule[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      while (i < actions.size()) {
        const Action& a = actions[i];
        double start = free_at[static_cast<size_t>(r)];
        bool ready = true;
        for (const auto& [key, latency] : inputs(r, a)) {
          auto it = done.find(key);
          if (it == done.end()) {
            ready = false;
            break;
          }
          start = std::max(start, it->second + latency);
        }
        if (!ready) break;
        const double cost = (a.kind == Action::Forward ? costs.forward : costs.backward) / v;
        done[{a.kind, a.micro, a.chunk * p + r}] = start + cost;
        free_at[static_cast<size_t>(r)] = start + cost;
        res.busy[static_cast<size_t>(r)] += cost;
        res.start[static_cast<size_t>(r)].push_back(start);
        int64_t& f = in_flight[static_cast<size_t>(r)];
        f += a.kind == Action::Forward ? 1 : -1;
        res.peak_in_flight[static_cast<size_t>(r)] =
            std::max(res.peak_in_flight[static_cast<size_t>(r)], f);
        ++i;
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string why;
      for (int r = 0; r < p; ++r) {
        const size_t i = next[static_cast<size_t>(r)];
        if (i == schedule[static_cast<size_t>(r)].size()) continue;
        const Action& a = schedule[static_cast<size_t>(r)][i];
        for (const auto& [key, latency] : inputs(r, a)) {
          if (done.count(key)) continue;
          const auto& [kind, micro, vs] = key;
          why +=
              fmt::format("; rank {} waits at {} for {}{} of virtual stage {} on rank {}", r,
                          describe(a, v), kind == Action::Forward ? 'F' : 'B', micro, vs, vs % p);
          break;
        }
      }
      DTL_CHECK(false, "pipeline schedule: deadlock" + why);
    }
  }
  res.makespan = *std::max_element(free_at.begin(), free_at.end());
  double busy = 0;
  for (double b : res.busy) busy += b;
  res.bubble = res.makespan > 0 ? 1.0 - busy / (p * res.makespan) : 0.0;
  return res;
}

// ---------------------------------------------------------------- Task 3

StepResult execute(const Schedule& schedule, ModelChunks& chunks, PipelineLinks& links,
                   torch::optim::Optimizer& optimizer, const torch::Tensor& global_batch,
                   const ExecuteOptions& options) {
  const int p = chunks.ranks(), v = chunks.num_chunks(), r = chunks.rank();
  DTL_CHECK(static_cast<int>(schedule.size()) == p,
            fmt::format("execute: the schedule has {} ranks, the pipeline {}", schedule.size(), p));
  const int64_t m = check_schedule(schedule, v);  // before any communication, on every rank
  check_link_order(schedule, v);
  DTL_CHECK(global_batch.dim() == 2 && global_batch.size(0) % m == 0,
            fmt::format("execute: the global batch of {} rows is not divisible into m={} "
                        "micro-batches",
                        global_batch.size(0), m));
  const GPTConfig& cfg = chunks.stage(0).config();
  const int64_t mb = global_batch.size(0) / m, T = global_batch.size(1) - 1;
  const torch::Device device = chunks.comm().device();

  struct InFlight {
    torch::Tensor input;   // received activation (leaf requiring grad); undefined on stage 0
    torch::Tensor output;  // sent activation, or the loss on the last stage
  };
  std::map<std::pair<int64_t, int>, InFlight> saved;  // by (micro, chunk)
  // p = 1: chunks of the same rank hand activations and gradients over without communication.
  std::map<std::pair<int64_t, int>, torch::Tensor> local_activation, local_grad;
  std::vector<Work> sends;  // kept until the end of the step (the tensors must live until sent)
  StepResult res;
  double loss_sum = 0;
  int64_t in_flight = 0;

  optimizer.zero_grad();
  DeviceTimer step_timer;
  // Emulated compute: pad the action to its share of a stage's time *before* its output leaves,
  // as real compute would delay it (padding after the send would let the neighbours run ahead).
  auto pad_to = [&](double start, double stage_seconds) {
    const double left = start + stage_seconds / v - step_timer.seconds();
    if (stage_seconds > 0 && left > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(left));
  };

  for (const Action& a : schedule[static_cast<size_t>(r)]) {
    const torch::Tensor tokens = global_batch.narrow(0, a.micro * mb, mb);
    if (a.kind == Action::Forward) {
      InFlight f;
      torch::Tensor x;
      if (chunks.is_first(a.chunk)) {
        x = tokens.narrow(1, 0, T);
      } else {
        if (p == 1) {
          f.input = local_activation.at({a.micro, a.chunk - 1});
          local_activation.erase({a.micro, a.chunk - 1});
        } else {
          f.input = torch::empty({mb, T, cfg.d_model}, torch::TensorOptions().device(device));
          links.activations_from_prev().recv(f.input, chunks.prev_rank(a.chunk));
        }
        f.input.requires_grad_(true);
        x = f.input;
      }
      const double start = step_timer.seconds();  // the input is here: the action starts
      DTL_SCOPE(describe(a, v));
      torch::Tensor out = chunks.stage(a.chunk).run_units(x);
      pad_to(start, options.forward_seconds);
      if (chunks.is_last(a.chunk)) {
        out = dtl::model::lm_loss(out, tokens.narrow(1, 1, T));
        loss_sum += out.item<double>();
      } else if (p == 1) {
        local_activation[{a.micro, a.chunk}] = out.detach();
      } else {
        // Asynchronous: the next rank may still be busy; this rank goes on with its list.
        sends.push_back(links.activations_to_next().send_async(out.detach().contiguous(),
                                                               chunks.next_rank(a.chunk)));
      }
      f.output = out;
      res.timeline.push_back({a, start, step_timer.seconds()});
      saved[{a.micro, a.chunk}] = std::move(f);
      res.peak_in_flight = std::max(res.peak_in_flight, ++in_flight);
    } else {
      auto it = saved.find({a.micro, a.chunk});
      DTL_CHECK(it != saved.end(),
                fmt::format("execute: rank {} runs {} before its forward", r, describe(a, v)));
      InFlight f = std::move(it->second);
      saved.erase(it);
      torch::Tensor grad;
      if (!chunks.is_last(a.chunk)) {
        if (p == 1) {
          grad = local_grad.at({a.micro, a.chunk + 1});
          local_grad.erase({a.micro, a.chunk + 1});
        } else {
          grad = torch::empty_like(f.output);
          links.grads_from_next().recv(grad, chunks.next_rank(a.chunk));
        }
      }
      const double start = step_timer.seconds();
      {
        DTL_SCOPE(describe(a, v));
        // Scaling by 1/m makes the summed micro-batch gradients those of the global mean loss.
        if (chunks.is_last(a.chunk))
          (f.output / static_cast<double>(m)).backward();
        else
          f.output.backward(grad);
        pad_to(start, options.backward_seconds);
        if (!chunks.is_first(a.chunk)) {
          if (p == 1)
            local_grad[{a.micro, a.chunk}] = f.input.grad();
          else
            sends.push_back(links.grads_to_prev().send_async(f.input.grad().contiguous(),
                                                             chunks.prev_rank(a.chunk)));
        }
      }
      res.timeline.push_back({a, start, step_timer.seconds()});
      --in_flight;
    }
  }
  for (Work& w : sends) w.wait();
  res.seconds = step_timer.seconds();
  chunks.sum_tied_embedding_grads();
  optimizer.step();

  // The loss lives on the rank of the last virtual stage: p - 1.
  torch::Tensor loss =
      torch::tensor({loss_sum / static_cast<double>(m)}, torch::kFloat64).to(device);
  chunks.comm().broadcast(loss, p - 1);
  res.loss = loss.item<double>();
  return res;
}

}  // namespace dtl::lab12
