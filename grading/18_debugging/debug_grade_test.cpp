// Grading tests of lab 18 (hidden from students until the due date). They check nothing the
// header does not promise: the ring at capacity 1, Comms that share a name, recording from many
// threads while dumping; the reporter's grace for a dead rank, the backstop when the reporter
// died, one reporter when every rank times out at once, a queued op behind a stuck one; more
// analyzer cases (two dead ranks, dtype and op mismatches, ties, a cycle on two ranks, failed
// ranks, world sizes that disagree); fingerprints of roots, reductions, sequence numbers and
// uneven all_gather / reduce_scatter chunks; NaN on several ranks and on a sub-Comm; tied
// weights in the OOM report; the replica check's hash of bytes in every dtype and strides, its
// majority on a sub-Comm, a real model among many tensors; and faults on other ranks and world
// sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "dtl/memory.hpp"
#include "tests/debug_test_util.hpp"

namespace lab18_test {
namespace {

using dtl::testing::expect_error_mentions;
using State = OpRecord::State;

// Every rank's value, on every rank.
std::vector<int64_t> gather_ints(Comm& comm, int64_t mine) {
  torch::Tensor all = torch::zeros({comm.size()}, torch::TensorOptions().dtype(torch::kInt64).device(comm.device()));
  comm.all_gather(all, torch::full({1}, mine, all.options()));
  torch::Tensor host = all.cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + comm.size());
}

WatchdogOptions manual(const std::string& dir, double timeout, double grace, std::function<void(int)> end) {
  WatchdogOptions o;
  o.dir = dir;
  o.timeout_s = timeout;
  o.grace_s = grace;
  o.poll_s = 0;
  o.end_job = std::move(end);
  return o;
}

// ---------------------------------------------------------------- Task 1

TEST(GradeRecorder, CapacityOneAndCommsThatShareAName) {
  auto a = named_comm("twin"), b = named_comm("twin");
  FlightRecorder one(1);
  for (uint64_t s = 1; s <= 3; ++s) feed(one, *a, s, State::Completed, s);
  const auto kept = observed(one.entries(), Source::kComputed);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].seq, 3u);
  EXPECT_EQ(kept[0].id, 2u);
  EXPECT_EQ(OBSERVE(one.dropped()), 2u);
  // A second Comm of the same name starts again at seq 1: an update goes to the newest entry.
  FlightRecorder fr(8);
  feed(fr, *a, 1, State::Started, 1.0);
  feed(fr, *b, 1, State::Issued, 2.0);
  fr.record(*b, op_record(1, OpType::AllReduce, State::Completed, 2.0));
  const auto e = observed(fr.entries(), Source::kComputed);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].state, "started");
  EXPECT_EQ(e[1].state, "completed");
}

// Four threads record 20000 ops each, all at once, while the main thread dumps: nothing lost,
// no id twice, every dump a whole JSON file. Five rounds: a race shows up in some of them.
TEST(GradeRecorder, ManyThreadsRecordWhileOneDumps) {
  constexpr uint64_t kPerThread = 20000, kThreads = 4, kAll = kPerThread * kThreads;
  auto comm = named_comm("threads");
  auto dir = scratch(*comm);
  std::vector<std::shared_ptr<Comm>> comms;
  for (uint64_t t = 0; t < kThreads; ++t) comms.push_back(named_comm("thread" + std::to_string(t)));
  for (int round = 0; round < 5; ++round) {
    FlightRecorder fr(kAll);
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (uint64_t t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();  // all at once
        for (uint64_t s = 1; s <= kPerThread; ++s) feed(fr, *comms[t], s, State::Completed, static_cast<double>(s));
      });
    go = true;
    bool dumps_ok = true;
    if (round == 0) {
      for (int k = 0; k < 2; ++k) {
        const json j = read_json(fr.dump(dir / ("r" + std::to_string(comm->rank())), "during"));
        dumps_ok = dumps_ok && j.is_object() && j["entries"].size() <= kAll;
      }
    }
    for (auto& th : threads) th.join();
    EXPECT_TRUE(OBSERVE(dumps_ok));  // files the student's code wrote, read back
    const auto e = fr.entries();
    std::set<uint64_t> ids;
    std::set<std::pair<std::string, uint64_t>> ops;
    int64_t unfinished = 0;
    for (const auto& x : e) {
      ids.insert(x.id);
      ops.insert({x.comm, x.seq});
      unfinished += x.state != "completed";
    }
    // The counts, not the 80000 entries: observed as (entries, distinct ids, distinct ops,
    // unfinished).
    const auto counts = OBSERVE(
        (std::vector<int64_t>{static_cast<int64_t>(e.size()), static_cast<int64_t>(ids.size()),
                              static_cast<int64_t>(ops.size()), unfinished}));
    ASSERT_EQ(counts.size(), 4u);
    const auto all = static_cast<int64_t>(kAll);
    ASSERT_EQ(counts[0], all);
    ASSERT_EQ(counts[1], all) << "ids given twice (round " << round << ")";
    ASSERT_EQ(counts[2], all) << "ops lost or recorded twice (round " << round << ")";
    ASSERT_EQ(counts[3], 0) << "updates lost (round " << round << ")";
  }
}

// ---------------------------------------------------------------- Task 2

// The last rank is dead (it never polls): the reporter waits grace_s for its dump, not longer.
TEST(GradeWatchdog, GraceBoundsTheWaitForADeadRank) {
  auto comm = named_comm("gwd-grace");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs a second rank";
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  const double t0 = dtl::now_seconds();
  if (r == 0) feed(fr, *comm, 1, State::Started, t0);
  int calls = 0;
  Watchdog wd(fr, manual(dir.path(), 1, 2, [&](int) { ++calls; }));
  auto round = [&](double t) {
    if (r != n - 1) wd.poll(t0 + t);
    comm->barrier();
  };
  round(1.5);  // rank 0 fires and dumps at t0 + 1.5
  round(1.6);
  round(1.7);
  round(3.4);  // grace not over: no report yet
  EXPECT_FALSE(observed_exists(dir / "report.json"))
      << "the reporter must wait grace_s for a missing dump";
  comm->barrier();
  round(3.6);
  ASSERT_TRUE(observed_exists(dir / "report.json"));
  const json report = observed_json(dir / "report.json");
  ASSERT_FALSE(report["findings"].empty());
  const Finding f = report["findings"][0].get<Finding>();
  EXPECT_EQ(f.kind, "dead");
  EXPECT_EQ(f.ranks, std::vector<int>({n - 1}));
  EXPECT_EQ(f.seq, 1u);
  if (r == 0) {
    EXPECT_EQ(OBSERVE(calls), 1);
  }
}

// Rank 0 signals (fail) and then dies: the others end themselves 3 x grace_s after their dump.
TEST(GradeWatchdog, BackstopEndsTheRanksOfADeadReporter) {
  auto comm = named_comm("gwd-backstop");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs a second rank";
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  int calls = 0;
  Watchdog wd(fr, manual(dir.path(), 60, 1, [&](int) { ++calls; }));
  if (r == 0) wd.fail({"error", {0}, "", 0, "", "forward", 2, "rank 0 failed (test)"});
  comm->barrier();
  const double t = dtl::now_seconds();
  if (r != 0) {
    wd.poll(t);
    EXPECT_TRUE(OBSERVE(wd.dumped()));
    wd.poll(t + 2.9);
    EXPECT_EQ(OBSERVE(calls), 0) << "3 x grace_s have not passed";
    wd.poll(t + 3.2);
    EXPECT_EQ(OBSERVE(calls), 1) << "no report 3 x grace_s after the dump: end";
    EXPECT_TRUE(OBSERVE(wd.ended()));
  }
  comm->barrier();
}

// Every rank times out in the same poll: one trigger, one reporter.
TEST(GradeWatchdog, RanksTimingOutTogetherElectOneReporter) {
  auto comm = named_comm("gwd-race");
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  const double t0 = dtl::now_seconds();
  feed(fr, *comm, 1, State::Started, t0);
  Watchdog wd(fr, manual(dir.path(), 1, 5, [](int) {}));
  comm->barrier();
  wd.poll(t0 + 2);
  comm->barrier();
  const auto reporters = OBSERVE(gather_ints(*comm, wd.reporter() ? 1 : 0));
  EXPECT_EQ(std::accumulate(reporters.begin(), reporters.end(), int64_t{0}), 1);
  const json trigger = observed_json(dir / "trigger");
  ASSERT_TRUE(trigger.is_object());
  EXPECT_EQ(reporters.at(static_cast<size_t>(trigger["rank"].get<int>())), 1);
}

// An op that was issued and never started (queued behind a stuck one) is overdue too, from its
// issue; the reason names the oldest overdue op.
TEST(GradeWatchdog, TheOldestOverdueOpIsTheReason) {
  auto comm = named_comm("gwd-queue");
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  const double t0 = dtl::now_seconds();
  feed(fr, *comm, 1, State::Issued, t0);
  feed(fr, *comm, 2, State::Started, t0 + 0.2);
  Watchdog wd(fr, manual(dir.path(), 1, 5, [](int) {}));
  wd.poll(t0 + 1.5);
  EXPECT_TRUE(OBSERVE(wd.dumped()));
  const json mine = observed_json(dir / ("rank-" + std::to_string(dtl::world().rank()) + ".json"));
  const std::string reason = mine.value("reason", "");
  EXPECT_THAT(reason, ::testing::HasSubstr("all_reduce #1 on comm 'gwd-queue'"));
  comm->barrier();
}

// ---------------------------------------------------------------- Task 3

TEST(GradeAnalyzer, TwoDeadRanks) {
  auto comm = named_comm("gan-2dead");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 2})
      write_dump(d, {r, 4, {"grads"}, {dump_entry("grads", 1, "completed", 1), dump_entry("grads", 2, "started", 2)}});
  });
  ASSERT_GE(a.findings.size(), 2u);
  EXPECT_EQ(a.findings[0].kind, "dead");
  EXPECT_EQ(a.findings[1].kind, "dead");
  std::set<int> dead = {a.findings[0].ranks.at(0), a.findings[1].ranks.at(0)};
  EXPECT_EQ(dead, std::set<int>({1, 3}));
  EXPECT_EQ(a.findings[0].seq, 2u);
}

TEST(GradeAnalyzer, DtypeAndOpMismatchesAndTies) {
  auto comm = named_comm("gan-mis");
  auto dir = scratch(*comm);
  Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 1, 2})
      write_dump(d, {r, 3, {"c"}, {dump_entry("c", 4, "completed", 1, {8}, "all_reduce", r == 0 ? "float" : "long")}});
  });
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(a.findings[0].kind, "mismatch");
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({0}));
  EXPECT_THAT(a.findings[0].message, ::testing::HasSubstr("long[8]"));
  a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 1, 2})
      write_dump(d, {r, 3, {"c"}, {dump_entry("c", 4, "completed", 1, {8}, r == 1 ? "broadcast" : "all_reduce")}});
  });
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({1}));
  EXPECT_EQ(a.findings[0].op, "all_reduce");
  EXPECT_THAT(a.findings[0].message, ::testing::HasSubstr("broadcast"));
  // Two ranks, one each: the lowest rank's is taken as right.
  a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 1}) write_dump(d, {r, 2, {"c"}, {dump_entry("c", 1, "completed", 1, {r == 0 ? 4 : 5})}});
  });
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({1}));
}

// Two ranks, each waiting in an op the other never issued: the cycle is broken by time, the op
// that got stuck first names the culprit.
TEST(GradeAnalyzer, ACycleOnTwoRanksIsBrokenByTheEarlierStuckOp) {
  auto comm = named_comm("gan-cycle");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    write_dump(d, {0, 2, {"grads", "metrics"}, {dump_entry("metrics", 1, "completed", 1), dump_entry("grads", 5, "started", 2.5)}});
    write_dump(d, {1, 2, {"grads", "metrics"}, {dump_entry("metrics", 1, "completed", 1), dump_entry("metrics", 2, "started", 2.0, {1})}});
  });
  ASSERT_GE(a.findings.size(), 2u);
  EXPECT_EQ(a.findings[0].kind, "missing");
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({0}));
  EXPECT_EQ(a.findings[0].comm, "metrics");
  EXPECT_EQ(a.findings[1].ranks, std::vector<int>({1}));
}

// A rank that failed is named by its failure, not again as missing; a dead rank that nothing
// waits for still dies; dumps of different world sizes are an error.
TEST(GradeAnalyzer, FailedDeadAndInconsistentDumps) {
  auto comm = named_comm("gan-misc");
  auto dir = scratch(*comm);
  Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    write_dump(d, {0, 2, {"g"}, {dump_entry("g", 3, "started", 1)}});
    DumpSpec failed{1, 2, {"g"}, {dump_entry("g", 2, "completed", 0.5)}};
    failed.failure = Finding{"oom", {1}, "", 0, "", "forward", 1, "rank 1 ran out of memory"};
    write_dump(d, failed);
  });
  ASSERT_EQ(a.findings.size(), 1u) << a.report();
  EXPECT_EQ(a.findings[0].kind, "oom");
  a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    write_dump(d, {0, 2, {"g"}, {dump_entry("g", 1, "completed", 1)}});
  });
  ASSERT_EQ(a.findings.size(), 1u);
  EXPECT_EQ(a.findings[0].kind, "dead");
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({1}));
  EXPECT_EQ(a.findings[0].seq, 0u);
  EXPECT_THAT(a.findings[0].message, ::testing::HasSubstr("died"));
  if (comm->rank() == 0) {
    fs::create_directories(dir / "sizes");
    write_dump(dir / "sizes", {0, 2, {"g"}, {}});
    write_dump(dir / "sizes", {1, 3, {"g"}, {}});
  }
  comm->barrier();
  expect_error_mentions([&] { analyze(dir / "sizes"); }, "world size");
  comm->barrier();
}

// ---------------------------------------------------------------- Task 4

Fingerprint fingerprint(OpType op, uint64_t seq, std::vector<int64_t> shape, int64_t detail,
                        torch::ScalarType dtype = torch::kFloat32) {
  Fingerprint f;
  f.op = op;
  f.seq = seq;
  f.shape = std::move(shape);
  f.detail = detail;
  f.dtype = dtype;
  return f;
}

// The error of cc.check(mine) on this rank ("" if none), observed; its finding into *finding.
std::string desync_of(CheckedComm& cc, const Fingerprint& mine, Finding* finding = nullptr,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const Raised e = raised_by<DesyncError>([&] { cc.check(mine); }, file, line);
  if (finding && e.raised) *finding = e.finding;
  return e.raised ? e.message : "";
}

TEST(GradeDesync, RootsReductionsDtypesAndSeqsAreChecked) {
  auto comm = named_comm("gds");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a desync needs a second rank";
  CheckedComm cc(*comm);
  const int odd = n >= 3 ? 0 : n - 1;  // the minority: rank 0 when a majority exists
  Finding f;
  std::string m = desync_of(cc, fingerprint(OpType::Broadcast, 2, {3}, r == odd ? 1 : 0), &f);
  EXPECT_THAT(m, ::testing::HasSubstr("(root 1)"));
  EXPECT_THAT(m, ::testing::HasSubstr("(root 0)"));
  EXPECT_EQ(f.ranks, std::vector<int>({odd}));
  EXPECT_EQ(f.op, "broadcast");
  m = desync_of(cc, fingerprint(OpType::AllReduce, 2, {3}, static_cast<int64_t>(r == odd ? dtl::ReduceOp::Max : dtl::ReduceOp::Sum)));
  EXPECT_THAT(m, ::testing::HasSubstr("(max)"));
  m = desync_of(cc, fingerprint(OpType::AllReduce, 2, {3}, 0, r == odd ? torch::kFloat64 : torch::kFloat32), &f);
  EXPECT_THAT(m, ::testing::HasSubstr("double[3]"));
  EXPECT_EQ(f.ranks, std::vector<int>({odd}));
  m = desync_of(cc, fingerprint(OpType::AllReduce, r == odd ? 5 : 4, {3}, 0), &f);
  EXPECT_THAT(m, ::testing::HasSubstr("all_reduce #5"));
  EXPECT_THAT(m, ::testing::HasSubstr("all_reduce #4"));
  EXPECT_EQ(f.seq, 4u) << "the majority's seq";
  // Shapes of different lengths: the check's own message must still have one size everywhere.
  m = desync_of(cc, fingerprint(OpType::AllReduce, 4, r == odd ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{8}, 0));
  EXPECT_THAT(m, ::testing::HasSubstr("float[2,4]"));
  EXPECT_THAT(m, ::testing::HasSubstr("float[8]"));
  EXPECT_EQ(desync_of(cc, fingerprint(OpType::AllReduce, 4, {1, 2, 3, 4, 5, 6, 7, 8}, 0)), "");
  expect_error_mentions([&] { cc.check(fingerprint(OpType::AllReduce, 4, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0)); },
                        "dimensions");
}

// Uneven chunks are no desync: all_gather's inputs and reduce_scatter's outputs differ between
// ranks by design; what must agree is the whole tensor.
TEST(GradeDesync, UnevenChunksAreNotADesync) {
  auto comm = named_comm("gds-uneven");
  const int n = comm->size(), r = comm->rank();
  CheckedComm cc(*comm);
  auto f = torch::TensorOptions().device(device());
  const dtl::Range mine = dtl::split_range(7, n, r);
  torch::Tensor g = torch::zeros({7}, f);
  cc.all_gather(g, torch::arange(mine.begin, mine.end, f.dtype(torch::kFloat32)));
  DTL_EXPECT_EQUAL(g.cpu(), torch::arange(7, torch::kFloat32));
  torch::Tensor out = torch::zeros({mine.size()}, f);
  cc.reduce_scatter(out, torch::ones({7}, f), dtl::ReduceOp::Max);
  DTL_EXPECT_EQUAL(out.cpu(), torch::ones({mine.size()}));
}

// ---------------------------------------------------------------- Task 5

TEST(GradeNonFinite, LowestRankOnASubCommAndActivations) {
  auto world = named_comm("gnf");
  const int n = world->size(), r = world->rank();
  auto f = torch::TensorOptions().device(device());
  // Every rank but 0 poisons a different tensor: the lowest such rank is named, the others too.
  NamedTensors t = {{"x", torch::ones({4}, f)}, {"y", torch::ones({4}, f)}};
  if (r >= 1) t[r % 2].second[1] = std::numeric_limits<float>::infinity();
  if (n >= 2) {
    const Raised e = raised_by<NonFiniteError>([&] { check_finite(*world, t, 11, "activation"); });
    if (!e.raised) {
      ADD_FAILURE() << "no NonFiniteError";
    } else {
      EXPECT_EQ(e.finding.ranks, std::vector<int>({1}));
      EXPECT_EQ(e.finding.name, "y");
      EXPECT_THAT(e.message, ::testing::HasSubstr("non-finite activation 'y'"));
      EXPECT_THAT(e.message, ::testing::HasSubstr("1 of 4"));
      std::vector<int> later;
      for (int k = 2; k < n; ++k) later.push_back(k);
      if (!later.empty()) {
        EXPECT_THAT(e.message, ::testing::HasSubstr(format_ranks(later)));
      }
    }
  }
  // On the Comm of the odd ranks, the culprit is named by its world rank.
  auto odd = world->split(r % 2, r, "gnf-odd");
  if (r % 2 == 1) {
    NamedTensors u = {{"z", torch::ones({2}, f)}};
    const int last_odd = n % 2 == 0 ? n - 1 : n - 2;
    if (r == last_odd) u[0].second[0] = std::nan("");
    const Raised e = raised_by<NonFiniteError>([&] { check_finite(*odd, u, 1, "gradient"); });
    if (!e.raised)
      ADD_FAILURE() << "no NonFiniteError";
    else
      EXPECT_EQ(e.finding.ranks, std::vector<int>({last_odd}));
  }
  world->barrier();
}

// ---------------------------------------------------------------- Task 6

// A weight listed under two names (tied) and the same storage in the optimizer state count once.
TEST(GradeOom, SharedStoragesCountOnce) {
  if (device().is_cuda()) GTEST_SKIP() << "memory limits and tags are CPU-only (dtl/memory.hpp)";
  torch::Tensor w = torch::ones({64, 32}).requires_grad_(), b = torch::ones({32}).requires_grad_();
  w.mutable_grad() = torch::ones({64, 32});
  NamedTensors params = {{"wte.weight", w}, {"lm_head.weight", w}, {"bias", b}};
  NamedTensors state = {{"w.exp_avg", torch::zeros({64, 32})}, {"alias", w.detach().view({-1})}};
  dtl::memory::set_limit(dtl::memory::current_bytes() + 64);
  std::optional<OomReport> raw;
  try {
    torch::Tensor big = torch::empty({4096});
  } catch (const dtl::OutOfMemory& e) {
    dtl::memory::set_limit(0);
    raw = oom_report(e, params, state, 9, "backward", 10);
  }
  dtl::memory::set_limit(0);
  ASSERT_TRUE(OBSERVE(raw.has_value()));
  const std::optional<OomReport> rep = observed(raw.value_or(OomReport{}));
  EXPECT_EQ(rep->parameters, 64 * 32 * 4 + 32 * 4);
  EXPECT_EQ(rep->gradients, 64 * 32 * 4) << "the second name's .grad is the same tensor";
  EXPECT_EQ(rep->optimizer_state, 64 * 32 * 4) << "the alias is a parameter's storage, counted already";
  EXPECT_LE(rep->largest.size(), 10u);
  ASSERT_FALSE(rep->largest.empty());
  EXPECT_EQ(rep->largest.front().second, 64 * 32 * 4);
  const Finding f = observed(raw.value_or(OomReport{}).finding());
  EXPECT_EQ(f.step, 9);
  EXPECT_EQ(f.name, "backward");
  EXPECT_THAT(f.message, ::testing::HasSubstr("backward"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("step 9"));
}

// ---------------------------------------------------------------- Task 7

// Bytes, not values: +0.0 and -0.0 compare equal, and float64 and integer dtypes hash their own
// bytes; the published FNV-1a vector on a strided slice of a larger tensor.
TEST(GradeReplicas, BytesNotValuesInEveryDtype) {
  auto f = torch::TensorOptions().device(device());
  torch::Tensor zeros = torch::zeros({4}, f), negative = zeros.clone();
  negative[2] = -0.0;
  ASSERT_TRUE(torch::equal(zeros, negative)) << "equal values";
  EXPECT_NE(OBSERVE(content_hash(zeros)), OBSERVE(content_hash(negative))) << "different bytes";
  // "foobar" as every other byte of a longer buffer: the slice's elements, not its storage.
  const std::string padded = "fxoxoxbxaxrx";
  torch::Tensor buffer =
      torch::tensor(std::vector<int64_t>(padded.begin(), padded.end()), torch::kInt64).to(torch::kUInt8).to(device());
  EXPECT_EQ(OBSERVE(content_hash(buffer.slice(0, 0, 12, 2))), 0x85944171f73967e8ULL);
  for (torch::ScalarType dtype : {torch::kFloat64, torch::kInt64, torch::kInt32, torch::kFloat16}) {
    torch::Tensor t = torch::arange(1, 10, f).to(dtype).reshape({3, 3});
    torch::Tensor u = t.clone();
    u.view({-1})[8] = 10;
    EXPECT_NE(OBSERVE(content_hash(u)), OBSERVE(content_hash(t))) << c10::toString(dtype);
    EXPECT_EQ(OBSERVE(content_hash(t.t().contiguous().t())), OBSERVE(content_hash(t))) << c10::toString(dtype);
  }
}

// With three ranks or more, rank 0 can be the odd one: the majority decides, not rank 0. On a
// Comm of some ranks, the culprit is named by its world rank.
TEST(GradeReplicas, MajorityNotRankZeroAndWorldRanksOfASubComm) {
  auto comm = named_comm("grep");
  const int n = comm->size(), r = comm->rank();
  auto f = torch::TensorOptions().device(device());
  auto params = [&] {
    return NamedTensors{{"a", torch::linspace(0, 1, 10, f)}, {"b", torch::linspace(1, 2, 7, f).reshape({7, 1})}};
  };
  if (n >= 3) {
    NamedTensors p = params();
    if (r == 0) p[1].second[6][0] = 2.5;
    const Raised e = raised_by<DivergenceError>([&] { check_replicas(*comm, p, 1); });
    EXPECT_TRUE(e.raised);
    EXPECT_EQ(e.finding.name, "b");
    EXPECT_EQ(e.finding.ranks, std::vector<int>({0}));
  }
  // The odd world ranks: on their Comm the last of them is off in "a".
  auto odd = comm->split(r % 2, r, "grep-odd");
  if (r % 2 == 1) {
    const int last_odd = n % 2 == 0 ? n - 1 : n - 2;
    NamedTensors p = params();
    if (r == last_odd && odd->size() > 1) p[0].second[9] = 7.0;
    const Raised e = raised_by<DivergenceError>([&] { check_replicas(*odd, p, 3); });
    EXPECT_EQ(e.raised, odd->size() > 1);
    if (e.raised) {
      EXPECT_EQ(e.finding.ranks, std::vector<int>({last_odd}));
    }
  }
  comm->barrier();
}

// A real model, 300 more tensors, one collective: its last parameter off by one ULP on the last
// rank is found and counted.
TEST(GradeReplicas, AModelAndManyTensorsInOneCollective) {
  auto comm = named_comm("grep-model");
  const int n = comm->size(), r = comm->rank();
  dtl::model::GPT m(dtl::model::GPTConfig::tiny());
  m->to(device());
  NamedTensors params;
  for (const auto& item : m->named_parameters()) params.emplace_back(item.key(), item.value());
  auto f = torch::TensorOptions().device(device());
  for (int i = 0; i < 300; ++i) params.emplace_back("extra." + std::to_string(i), torch::full({2}, i, f));
  const int64_t before = MEASURED(comm->stats()).total_count();
  check_replicas(*comm, params, 0);  // the same seed on every rank: the same model
  if (r == n - 1 && n > 1) {
    torch::NoGradGuard no_grad;
    torch::Tensor last = params[params.size() - 301].second;  // the model's last parameter
    last.detach().view({-1}).narrow(0, 0, 1).view(torch::kInt32).bitwise_xor_(1);
  }
  const Raised e = raised_by<DivergenceError>([&] { check_replicas(*comm, params, 1); });
  EXPECT_EQ(MEASURED(comm->stats()).total_count() - before, 2) << "one collective per check";
  EXPECT_EQ(e.raised, n > 1);
  if (e.raised) {
    EXPECT_EQ(e.finding.name, params[params.size() - 301].first);
    EXPECT_EQ(e.finding.ranks, std::vector<int>({n - 1}));
    EXPECT_THAT(e.message, ::testing::HasSubstr(fmt::format("1 of {}", params.size())));
  }
}

// ---------------------------------------------------------------- faults on other ranks

TEST(GradeFaults, SkipOnTheLastOfFourRanks) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("skip (4 ranks, rank 3)", 4, "skip", 3);
  expect_culprit(r, "missing", {3}, "grads", grads_allreduce_seq(1));
}

TEST(GradeFaults, CrashOfRankZeroOnTwoRanks) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("crash (2 ranks, rank 0)", 2, "crash", 0);
  expect_culprit(r, "dead", {0}, "grads", grads_allreduce_seq(1));
  EXPECT_EQ(r.report.value("reporter", -1), 1);
  EXPECT_EQ(r.dumps, std::vector<int>({1}));
}

// A flipped bit on rank 0 of four: the majority (ranks 1-3) names rank 0.
TEST(GradeFaults, FlipOnRankZeroOfFour) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("flip (4 ranks, rank 0, replica check)", 4, "flip", 0, false, /*replica=*/true);
  expect_culprit(r, "divergence", {0});
  EXPECT_EQ(r.first.name, "blocks.0.mlp.fc.weight");
  EXPECT_EQ(r.first.step, 1);
}

TEST(GradeFaults, NanOnRankZeroInDesyncMode) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("nan (3 ranks, rank 0, desync check)", 3, "nan", 0, /*desync=*/true);
  expect_culprit(r, "nan", {0});
  EXPECT_EQ(r.first.step, 1);
}

}  // namespace
}  // namespace lab18_test
