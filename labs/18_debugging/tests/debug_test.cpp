// Lab 18 public tests: the flight recorder, the watchdog and its side channel, the analyzer,
// desync check mode, the NaN/Inf detector, the OOM report, the replica check, and every fault
// injected into a real training job (new processes) ending with a report that names the culprit.
// Run: ./lab test 18.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>

#include "debug_test_util.hpp"
#include "dtl/memory.hpp"

namespace lab18_test {
namespace {

using dtl::testing::expect_error_mentions;
using State = OpRecord::State;

// ---------------------------------------------------------------- Task 1: the flight recorder

TEST(Recorder, RingKeepsTheLastCapacityOpsInIssueOrder) {
  auto comm = named_comm("ring");
  FlightRecorder fr(4);
  EXPECT_EQ(OBSERVE(fr.capacity()), 4u);
  for (uint64_t seq = 1; seq <= 6; ++seq) feed(fr, *comm, seq, State::Issued, 10.0 + seq);
  std::vector<FrEntry> e = observed(fr.entries(), Source::kComputed);
  ASSERT_EQ(e.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(e[i].seq, i + 3) << "oldest first: the last 4 of 6";
    EXPECT_EQ(e[i].id, i + 2) << "record ids count every op ever recorded";
    EXPECT_EQ(e[i].comm, "ring");
    EXPECT_EQ(e[i].op, "all_reduce");
    EXPECT_EQ(e[i].dtype, "float");
    EXPECT_EQ(e[i].shape, std::vector<int64_t>({8}));
    EXPECT_EQ(e[i].bytes, 32);
    EXPECT_EQ(e[i].state, "issued");
    EXPECT_DOUBLE_EQ(e[i].issued, 10.0 + i + 3);
  }
  EXPECT_EQ(OBSERVE(fr.dropped()), 2u);
  // Updates reach their entry; an update for a dropped op changes nothing.
  fr.record(*comm, op_record(5, OpType::AllReduce, State::Started, 15.0));
  fr.record(*comm, op_record(6, OpType::AllReduce, State::Started, 16.0));
  fr.record(*comm, op_record(6, OpType::AllReduce, State::Completed, 16.0));
  fr.record(*comm, op_record(1, OpType::AllReduce, State::Completed, 11.0));
  e = observed(fr.entries(), Source::kComputed);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].seq, 3u);
  EXPECT_EQ(e[2].state, "started");
  EXPECT_DOUBLE_EQ(e[2].started, 15.001);
  EXPECT_EQ(e[3].state, "completed");
  EXPECT_DOUBLE_EQ(e[3].finished, 16.002);
  EXPECT_EQ(e[1].state, "issued");
  // An update belongs to its own Comm: #4 of another Comm is another op.
  auto other = named_comm("ring-other");
  feed(fr, *other, 4, State::Started, 20.0);
  fr.record(*comm, op_record(4, OpType::AllReduce, State::Completed, 14.0));
  e = observed(fr.entries(), Source::kComputed);  // ring #4, #5, #6, ring-other #4
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].seq, 4u);
  EXPECT_EQ(e[0].comm, "ring");
  EXPECT_EQ(e[0].state, "completed");
  EXPECT_EQ(e[3].comm, "ring-other");
  EXPECT_EQ(e[3].state, "started");
  expect_error_mentions([] { FlightRecorder none(0); }, "capacity");
}

// Attached, the recorder sees every op of every Comm, with the runtime's numbers and states.
TEST(Recorder, RecordsEveryOpOfEveryCommWithItsStates) {
  auto comm = named_comm("seen");
  const int n = comm->size(), r = comm->rank();
  FlightRecorder fr(32);
  fr.attach();
  fr.attach();  // once is enough
  auto f = torch::TensorOptions().device(device());
  torch::Tensor a = torch::ones({4, 2}, f);
  comm->all_reduce(a);
  torch::Tensor gathered = torch::zeros({7}, f);
  comm->all_gather(gathered, torch::ones({dtl::split_range(7, n, r).size()}, f));
  torch::Tensor ids = torch::arange(3, f.dtype(torch::kInt64));
  comm->broadcast(ids, n - 1);
  comm->barrier();
  dtl::Work w = comm->all_reduce_async(a);
  w.wait();
  fr.detach();
  comm->barrier();  // not recorded
  // The entries' times are the runtime's, in the student's process: MEASURED.
  std::vector<FrEntry> mine;
  for (const FrEntry& e : observed(fr.entries(), Source::kMeasured))
    if (e.comm == "seen") mine.push_back(e);
  ASSERT_EQ(mine.size(), 5u);
  const std::vector<std::string> ops = {"all_reduce", "all_gather", "broadcast", "barrier", "all_reduce"};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(mine[i].seq, i + 1);
    EXPECT_EQ(mine[i].op, ops[i]);
    EXPECT_EQ(mine[i].state, "completed") << ops[i];
    EXPECT_GT(mine[i].issued, 0);
    EXPECT_LE(mine[i].issued, mine[i].started) << ops[i];
    EXPECT_LE(mine[i].started, mine[i].finished) << ops[i];
    if (i > 0) {
      EXPECT_GT(mine[i].id, mine[i - 1].id);
    }
  }
  EXPECT_EQ(mine[0].shape, std::vector<int64_t>({4, 2}));
  EXPECT_EQ(mine[0].bytes, 32);
  EXPECT_EQ(mine[1].shape, std::vector<int64_t>({7}));
  EXPECT_EQ(mine[2].dtype, "long");
  EXPECT_EQ(mine[2].peer, n - 1);
}

TEST(Recorder, DumpIsOneCompleteJsonFilePerRank) {
  auto comm = named_comm("dumped");
  const int n = comm->size(), r = comm->rank();
  auto dir = scratch(*comm);
  FlightRecorder fr(16);
  feed(fr, *comm, 1, State::Completed, 5.0, {3, 4});
  feed(fr, *comm, 2, State::Started, 6.0);
  Finding why{"nan", {r}, "", 0, "", "w", 3, "test failure"};
  // A stale dump of this rank, and a second name (a hard link) for its file: a dump written in
  // place would change what the second name shows; one renamed into place leaves it alone.
  const std::string mine = "rank-" + std::to_string(dtl::world().rank()) + ".json";
  const std::string witness = dir / ("witness-" + std::to_string(dtl::world().rank()));
  fs::create_directories(dir / "dumps");
  { std::ofstream(dir / ("dumps/" + mine)) << "stale"; }
  fs::create_hard_link(dir / ("dumps/" + mine), witness);
  const std::string path = fr.dump(dir / "dumps", "on demand: test", &why);
  {
    std::ifstream in(witness);
    const std::string old((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(OBSERVE(old), "stale")
        << "the dump was written into the existing file, in place: a reader "
        << "could see half of it. Write DIR/.rank-<r>.json.tmp, then rename";
  }
  EXPECT_EQ(observed_relative(path, dir.path()),
            "dumps/rank-" + std::to_string(dtl::world().rank()) + ".json");
  const json j = observed_json(path);
  ASSERT_TRUE(j.is_object()) << "not valid JSON: " << path;
  EXPECT_EQ(j["format"], "dtl-fr-1");
  EXPECT_EQ(j["rank"], dtl::world().rank());
  EXPECT_EQ(j["world_size"], n);
  EXPECT_EQ(j["reason"], "on demand: test");
  EXPECT_EQ(j["capacity"], 16);
  EXPECT_EQ(j["dropped"], 0);
  EXPECT_GT(j["time"].get<double>(), 0);
  ASSERT_TRUE(j["comms"].contains("dumped")) << j["comms"].dump();
  EXPECT_EQ(j["comms"]["dumped"]["rank"], r);
  EXPECT_EQ(j["comms"]["dumped"]["size"], n);
  EXPECT_EQ(j["comms"]["dumped"]["world_ranks"], json(comm->world_ranks()));
  ASSERT_EQ(j["entries"].size(), 2u);
  const json& e0 = j["entries"][0];
  EXPECT_EQ(e0["comm"], "dumped");
  EXPECT_EQ(e0["seq"], 1);
  EXPECT_EQ(e0["op"], "all_reduce");
  EXPECT_EQ(e0["dtype"], "float");
  EXPECT_EQ(e0["shape"], json({3, 4}));
  EXPECT_EQ(e0["bytes"], 48);
  EXPECT_EQ(e0["peer"], -1);
  EXPECT_EQ(e0["state"], "completed");
  EXPECT_DOUBLE_EQ(e0["issued"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(e0["finished"].get<double>(), 5.002);
  EXPECT_EQ(j["entries"][1]["state"], "started");
  EXPECT_DOUBLE_EQ(j["entries"][1]["finished"].get<double>(), 0.0);
  EXPECT_EQ(j["failure"].get<Finding>().name, "w");
  EXPECT_TRUE(OBSERVE(fr.to_json("x")["failure"].is_null()));
  comm->barrier();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "dumps"))
    names.push_back(e.path().filename().string());
  for (const auto& name : OBSERVE(names))
    EXPECT_EQ(name.rfind("rank-", 0), 0u) << "left behind: " << dir / ("dumps/" + name);
}

// ---------------------------------------------------------------- Task 2: the watchdog

// An op of this rank (every rank) issued long ago and completed, one just issued: no hang.
TEST(Watchdog, QuietWhileNothingIsOverdue) {
  auto comm = named_comm("quiet");
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  const double t0 = dtl::now_seconds();
  feed(fr, *comm, 1, State::Completed, t0 - 100);
  feed(fr, *comm, 2, State::Failed, t0 - 100);
  feed(fr, *comm, 3, State::Started, t0);
  int calls = 0;
  WatchdogOptions o;
  o.dir = dir.path();
  o.timeout_s = 2;
  o.poll_s = 0;
  o.end_job = [&](int) { ++calls; };
  Watchdog wd(fr, o);
  wd.poll(t0 + 1.9);
  comm->barrier();
  EXPECT_FALSE(OBSERVE(wd.dumped()));
  EXPECT_FALSE(observed_exists(dir / "trigger"));
  EXPECT_FALSE(observed_exists(dir / ("rank-" + std::to_string(dtl::world().rank()) + ".json")));
  EXPECT_EQ(OBSERVE(calls), 0);
  WatchdogOptions bad = o;
  bad.dir = "";
  expect_error_mentions([&] { Watchdog w(fr, bad); }, "dir");
}

// Rank 0's op #2 never completes. Past the timeout rank 0 creates the trigger and dumps, the
// others follow the signal and dump, rank 0 reports (the others are stragglers: they never
// issued #2 and wait in no op) and ends, and so does every rank once the report is there, once.
// Time is the test's: poll(now).
TEST(Watchdog, ATimeoutMakesEveryRankDumpAndOneRankReport) {
  auto comm = named_comm("wd");
  const int n = comm->size(), r = comm->rank();
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  const double t0 = dtl::now_seconds();
  feed(fr, *comm, 1, State::Completed, t0 - 1);
  if (r == 0) feed(fr, *comm, 2, State::Started, t0);
  int calls = 0, code = 0;
  WatchdogOptions o;
  o.dir = dir.path();
  o.timeout_s = 1;
  o.poll_s = 0;
  o.grace_s = 5;
  o.end_job = [&](int c) { ++calls, code = c; };
  Watchdog wd(fr, o);
  wd.poll(t0 + 0.5);
  comm->barrier();
  EXPECT_FALSE(observed_exists(dir / "trigger")) << "no op is overdue yet";
  comm->barrier();
  // Rounds of polls (each rank sees the others' files after a barrier): fire, follow, report,
  // end. Four rounds are enough; a few more change nothing.
  for (int round = 0; round < 6; ++round) {
    wd.poll(t0 + 1.5 + 0.1 * round);
    comm->barrier();
  }
  for (int k = 0; k < n; ++k)
    EXPECT_TRUE(observed_exists(dir / ("rank-" + std::to_string(k) + ".json"))) << k;
  const json trigger = observed_json(dir / "trigger");
  ASSERT_TRUE(trigger.is_object());
  EXPECT_EQ(trigger["rank"], 0);
  EXPECT_TRUE(OBSERVE(wd.dumped()));
  EXPECT_EQ(OBSERVE(wd.reporter()), r == 0);
  EXPECT_TRUE(OBSERVE(wd.ended()));
  EXPECT_EQ(OBSERVE(calls), 1);
  EXPECT_EQ(OBSERVE(code), kWatchdogExitCode);
  const json mine = observed_json(dir / ("rank-" + std::to_string(dtl::world().rank()) + ".json"));
  const std::string reason = mine["reason"];
  if (r == 0)
    EXPECT_EQ(reason.rfind("timeout: all_reduce #2 on comm 'wd'", 0), 0u) << reason;
  else
    EXPECT_EQ(reason.rfind("signal: rank 0: timeout", 0), 0u) << reason;
  const json report = observed_json(dir / "report.json");
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["reporter"], 0);
  EXPECT_EQ(report["world_size"], n);
  ASSERT_FALSE(report["findings"].empty()) << report.dump(1);
  if (n > 1) {
    const Finding f = report["findings"][0].get<Finding>();
    EXPECT_EQ(f.kind, "straggler");
    std::vector<int> others;
    for (int k = 1; k < n; ++k) others.push_back(k);
    EXPECT_EQ(f.ranks, others);
    EXPECT_EQ(f.seq, 2u);
  }
  wd.poll(t0 + 1000);  // done: no second dump, no second end
  EXPECT_EQ(OBSERVE(calls), 1);
}

// A rank that caught an exception dumps it at once and signals; it reports; no timeout needed.
TEST(Watchdog, FailureDumpsItsFindingAndSignalsTheOthers) {
  auto comm = named_comm("failing");
  const int n = comm->size(), r = comm->rank();
  auto dir = scratch(*comm);
  FlightRecorder fr(8);
  feed(fr, *comm, 1, State::Completed, dtl::now_seconds());
  std::atomic<int> calls{0};
  WatchdogOptions o;
  o.dir = dir.path();
  o.timeout_s = 60;
  o.poll_s = 0;
  o.grace_s = 5;
  o.end_job = [&](int) { ++calls; };
  Watchdog wd(fr, o);
  const Finding why{"nan", {n - 1}, "", 0, "", "blocks.0.mlp.fc.weight", 3, "non-finite gradient (test)"};
  if (r == n - 1) wd.fail(why);
  comm->barrier();
  for (int round = 0; round < 4; ++round) {
    wd.poll(dtl::now_seconds());
    comm->barrier();
  }
  EXPECT_EQ(OBSERVE(wd.reporter()), r == n - 1);
  EXPECT_EQ(OBSERVE(calls.load()), 1);
  const json mine = observed_json(dir / ("rank-" + std::to_string(dtl::world().rank()) + ".json"));
  ASSERT_TRUE(mine.is_object());
  if (r == n - 1) {
    EXPECT_EQ(mine["reason"], "failure: non-finite gradient (test)");
    EXPECT_EQ(mine["failure"].get<Finding>().name, "blocks.0.mlp.fc.weight");
  } else {
    EXPECT_TRUE(mine["failure"].is_null());
  }
  const json report = observed_json(dir / "report.json");
  ASSERT_TRUE(report.is_object());
  ASSERT_FALSE(report["findings"].empty()) << report.dump(1);
  const Finding first = report["findings"][0].get<Finding>();
  EXPECT_EQ(first.kind, "nan");
  EXPECT_EQ(first.ranks, std::vector<int>({n - 1}));
  EXPECT_EQ(first.step, 3);
}

// A real hang: rank 0 waits in an all_reduce the others join late. The watchdog's own thread
// catches it; when rank 0 has reported, the others join and the test ends normally.
TEST(Watchdog, ThreadCatchesARealHang) {
  auto comm = named_comm("hang");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a hang needs a second rank";
  auto dir = scratch(*comm);
  FlightRecorder fr(32);
  fr.attach();
  std::atomic<int> calls{0};
  WatchdogOptions o;
  o.dir = dir.path();
  o.timeout_s = 0.5;
  o.poll_s = 0.02;
  o.grace_s = 2;
  o.end_job = [&](int) { ++calls; };
  const uint64_t seq = comm->ops_issued() + 1;
  bool reporter = false;
  {
    Watchdog wd(fr, o);
    torch::Tensor t = torch::ones({4}, torch::TensorOptions().device(device()));
    const double give_up = dtl::now_seconds() + 30;
    dtl::Work w;
    if (r == 0) w = comm->all_reduce_async(t);
    // Every rank's watchdog ends it (here: calls our end_job) once rank 0 has reported.
    while (calls.load() == 0 && dtl::now_seconds() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    reporter = wd.reporter();
    if (r == 0)
      w.wait();
    else
      comm->all_reduce(t);
  }
  fr.detach();
  EXPECT_EQ(OBSERVE(calls.load()), 1);
  EXPECT_EQ(OBSERVE(reporter), r == 0);
  const json report = observed_json(dir / "report.json");
  ASSERT_TRUE(report.is_object()) << "no report within 30 s";
  ASSERT_FALSE(report["findings"].empty()) << report.dump(1);
  const Finding f = report["findings"][0].get<Finding>();
  EXPECT_EQ(f.kind, "straggler") << f.message;
  EXPECT_EQ(f.comm, "hang");
  EXPECT_EQ(f.seq, seq);
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_EQ(f.ranks.size(), static_cast<size_t>(n - 1));
}

// ---------------------------------------------------------------- Task 3: the analyzer

// Three ranks wait in grads #5; rank 1 left no dump.
TEST(Analyzer, NamesTheRankThatDied) {
  auto comm = named_comm("an-dead");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 2, 3})
      write_dump(d, {r, 4, {"grads", "metrics"},
                     {dump_entry("grads", 4, "completed", 1), dump_entry("metrics", 2, "completed", 1.5),
                      dump_entry("grads", 5, "started", 2 + r * 0.01)}});
  });
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.dumped, std::vector<int>({0, 2, 3}));
  ASSERT_FALSE(a.findings.empty());
  const Finding& f = a.findings[0];
  EXPECT_EQ(f.kind, "dead");
  EXPECT_EQ(f.ranks, std::vector<int>({1}));
  EXPECT_EQ(f.comm, "grads");
  EXPECT_EQ(f.seq, 5u);
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_THAT(f.message, ::testing::HasSubstr("rank 1"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("died"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("all_reduce #5 on comm 'grads'"));
  EXPECT_THAT(a.report(),
              ::testing::HasSubstr("died"));  // the given report() of the observed findings
}

// Ranks 0 and 2 wait in metrics #3; rank 1 never issued it and waits in grads #5: it took
// another path. (Ranks 0 and 2 never issued grads #5 either: the finding naming fewer ranks
// comes first, although rank 1's op got stuck earlier.)
TEST(Analyzer, NamesTheRankThatNeverIssuedTheCollective) {
  auto comm = named_comm("an-missing");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 2})
      write_dump(d, {r, 3, {"grads", "metrics"},
                     {dump_entry("grads", 4, "completed", 1), dump_entry("metrics", 2, "completed", 1.5),
                      dump_entry("metrics", 3, "started", 2, {1})}});
    // Rank 1 got stuck first (1.9 s, before the others' 2 s): the rule "fewer ranks first"
    // decides before the time does.
    write_dump(d, {1, 3, {"grads", "metrics"},
                   {dump_entry("grads", 4, "completed", 1), dump_entry("metrics", 2, "completed", 1.5),
                    dump_entry("grads", 5, "started", 1.9)}});
  });
  ASSERT_GE(a.findings.size(), 2u);
  const Finding& f = a.findings[0];
  EXPECT_EQ(f.kind, "missing");
  EXPECT_EQ(f.ranks, std::vector<int>({1}));
  EXPECT_EQ(f.comm, "metrics");
  EXPECT_EQ(f.seq, 3u);
  EXPECT_THAT(f.message, ::testing::HasSubstr("never issued"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("all_reduce #3 on comm 'metrics'"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("all_reduce #5 on comm 'grads'"));
  EXPECT_EQ(a.findings[1].kind, "missing");
  EXPECT_EQ(a.findings[1].ranks, std::vector<int>({0, 2}));
  EXPECT_EQ(a.findings[1].comm, "grads");
}

// Rank 1 never issued grads #5 and waits in nothing: slow, not lost.
TEST(Analyzer, NamesTheStraggler) {
  auto comm = named_comm("an-slow");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 2})
      write_dump(d, {r, 3, {"grads"}, {dump_entry("grads", 4, "completed", 1), dump_entry("grads", 5, "issued", 2)}});
    write_dump(d, {1, 3, {"grads"}, {dump_entry("grads", 4, "completed", 1)}});
  });
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(a.findings[0].kind, "straggler");
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({1}));
  EXPECT_EQ(a.findings[0].seq, 5u);
  EXPECT_THAT(a.findings[0].message, ::testing::HasSubstr("straggler"));
  EXPECT_THAT(a.findings[0].message, ::testing::HasSubstr("rank 1"));
}

// Every rank completed grads #3, but rank 2 ran it on a [9] tensor, the others on [8].
TEST(Analyzer, NamesTheRanksWhoseShapesDisagree) {
  auto comm = named_comm("an-shape");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 1, 2})
      write_dump(d, {r, 3, {"grads"},
                     {dump_entry("grads", 2, "completed", 1, {8}),
                      dump_entry("grads", 3, "completed", 2, {r == 2 ? 9 : 8}),
                      dump_entry("grads", 4, "completed", 3, {r == 2 ? 7 : 6})}});
  });
  ASSERT_FALSE(a.findings.empty());
  const Finding& f = a.findings[0];
  EXPECT_EQ(f.kind, "mismatch");
  EXPECT_EQ(f.ranks, std::vector<int>({2}));
  EXPECT_EQ(f.seq, 3u) << "the first seq that disagrees";
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_THAT(f.message, ::testing::HasSubstr("disagree"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("float[9]"));
  EXPECT_THAT(f.message, ::testing::HasSubstr("float[8]"));
}

// A failure recorded by several ranks is one finding, and failures come before hangs.
TEST(Analyzer, FailuresComeFirstAndOnce) {
  auto comm = named_comm("an-fail");
  auto dir = scratch(*comm);
  const Finding desync{"desync", {1}, "grads", 9, "all_reduce", "", -1, "desync on comm 'grads': ..."};
  const Analysis a = analyze_written(*comm, dir.path(), [&](const std::string& d) {
    for (int r : {0, 1, 2}) {
      DumpSpec s{r, 3, {"grads"}, {dump_entry("grads", 8, "completed", 1)}};
      s.failure = desync;
      s.reason = "failure: " + desync.message;
      write_dump(d, s);
    }
  });
  ASSERT_EQ(a.findings.size(), 1u);
  EXPECT_EQ(a.findings[0].kind, "desync");
  EXPECT_EQ(a.findings[0].ranks, std::vector<int>({1}));
  EXPECT_EQ(a.findings[0].seq, 9u);
}

TEST(Analyzer, HealthyDumpsHaveNoCulprit) {
  auto comm = named_comm("an-ok");
  auto dir = scratch(*comm);
  const Analysis a = analyze_written(*comm, dir.path(), [](const std::string& d) {
    for (int r : {0, 1})
      write_dump(d, {r, 2, {"grads"}, {dump_entry("grads", 1, "completed", 1), dump_entry("grads", 2, "completed", 2)}});
  });
  ASSERT_EQ(a.findings.size(), 1u);
  EXPECT_EQ(a.findings[0].kind, "none");
  EXPECT_THAT(a.findings[0].message, ::testing::HasSubstr("no culprit"));
  expect_error_mentions([&] { analyze(dir / "nothing-here"); }, "no dump");
}

// ---------------------------------------------------------------- Task 4: desync check

// Checked collectives give the plain results, and the checks travel on a Comm of their own: the
// checked Comm counts exactly its real ops.
TEST(Desync, MatchingCollectivesRunAndKeepTheirNumbers) {
  auto comm = named_comm("dsc");
  const int n = comm->size(), r = comm->rank();
  auto f = torch::TensorOptions().device(device());
  {
    CheckedComm cc(*comm);  // one op of comm: the split that makes the check's Comm
    // The Comms' counts and names are the student's process's: MEASURED.
    const uint64_t before = MEASURED(comm->ops_issued());
    EXPECT_TRUE(OBSERVE(cc.checking()));
    EXPECT_TRUE(OBSERVE(&cc.comm() == comm.get())) << "comm() is the Comm it checks";
    torch::Tensor a = torch::full({3, 2}, static_cast<double>(r + 1), f);
    cc.all_reduce(a);
    DTL_EXPECT_EQUAL(a.cpu(), torch::full({3, 2}, n * (n + 1) / 2.0));
    torch::Tensor g = torch::zeros({7}, f);
    const dtl::Range mine = dtl::split_range(7, n, r);
    cc.all_gather(g, torch::arange(mine.begin, mine.end, f.dtype(torch::kFloat32)));
    DTL_EXPECT_EQUAL(g.cpu(), torch::arange(7, torch::kFloat32));
    torch::Tensor rs = torch::zeros({mine.size()}, f);
    cc.reduce_scatter(rs, torch::ones({7}, f));
    DTL_EXPECT_EQUAL(rs.cpu(), torch::full({mine.size()}, static_cast<double>(n)));
    torch::Tensor b = torch::full({2}, static_cast<int64_t>(r), f.dtype(torch::kInt64));
    cc.broadcast(b, n - 1);
    DTL_EXPECT_EQUAL(b.cpu(), torch::full({2}, static_cast<int64_t>(n - 1)));
    cc.barrier();
    EXPECT_EQ(MEASURED(comm->ops_issued()) - before, 5u)
        << "the checks must not use the checked Comm";
    bool found = false;
    for (const auto& c : Comm::snapshot_all())
      if (c.name == "dsc/check") found = true;
    EXPECT_TRUE(MEASURED(found)) << "the check's own Comm: comm.split(0, rank, \"dsc/check\")";
  }
  const uint64_t before = MEASURED(comm->ops_issued());
  CheckedComm plain(*comm, false);
  EXPECT_FALSE(OBSERVE(plain.checking()));
  torch::Tensor a = torch::ones({2}, f);
  plain.all_reduce(a);
  EXPECT_EQ(MEASURED(comm->ops_issued()) - before, 1u) << "not checking: no check Comm, no check";
}

// The last rank's fingerprint differs: every rank raises, naming both sides. check() alone (no
// real op): a rank that failed to raise continues without hanging.
TEST(Desync, MismatchRaisesOnEveryRankNamingBothSides) {
  auto comm = named_comm("dsc2");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a desync needs a second rank";
  CheckedComm cc(*comm);
  Fingerprint fp;
  fp.op = OpType::AllReduce;
  fp.seq = 3;
  fp.dtype = torch::kFloat32;
  fp.shape = {r == n - 1 ? 9 : 8};
  fp.detail = static_cast<int64_t>(dtl::ReduceOp::Sum);
  EXPECT_EQ(OBSERVE(fp.describe()),
            r == n - 1 ? "all_reduce #3 float[9] (sum)" : "all_reduce #3 float[8] (sum)");
  std::vector<int> others;
  for (int k = 0; k < n - 1; ++k) others.push_back(k);
  const Raised e = raised_by<DesyncError>([&] { cc.check(fp); });
  if (e.raised) {
    EXPECT_EQ(e.finding.kind, "desync");
    EXPECT_EQ(e.finding.ranks, std::vector<int>({n - 1}));
    EXPECT_EQ(e.finding.comm, "dsc2");
    EXPECT_EQ(e.finding.seq, 3u);
    EXPECT_EQ(e.finding.op, "all_reduce");
    const std::string& m = e.message;
    EXPECT_THAT(m, ::testing::HasSubstr("desync on comm 'dsc2'"));
    EXPECT_THAT(m, ::testing::HasSubstr(format_ranks({n - 1}) + " issues all_reduce #3 float[9] (sum)"));
    EXPECT_THAT(m, ::testing::HasSubstr(format_ranks(others)));
    EXPECT_THAT(m, ::testing::HasSubstr("float[8]"));
  }
  EXPECT_TRUE(e.raised) << "every rank must raise, or the others wait in the real op";
  fp.shape = {8};
  cc.check(fp);  // agreement again: no error
}

// ---------------------------------------------------------------- Task 5: NaN / Inf detector

TEST(NonFinite, FindsTheFirstNonFiniteTensor) {
  auto f = torch::TensorOptions().device(device());
  torch::Tensor ok = torch::ones({4}, f), nan2 = torch::ones({3, 3}, f), inf = torch::ones({5}, f);
  nan2.view({-1})[2] = std::nan("");
  nan2.view({-1})[7] = std::nan("");
  inf[4] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(OBSERVE(first_non_finite({{"ok", ok}, {"nan2", nan2}, {"inf", inf}})),
            std::make_pair(int64_t{1}, int64_t{2}));
  EXPECT_EQ(OBSERVE(first_non_finite({{"ok", ok}, {"none", torch::Tensor()}, {"inf", inf}})),
            std::make_pair(int64_t{2}, int64_t{1}));
  EXPECT_EQ(OBSERVE(first_non_finite({{"ok", ok}})), std::make_pair(int64_t{-1}, int64_t{0}));
  EXPECT_EQ(OBSERVE(first_non_finite({})), std::make_pair(int64_t{-1}, int64_t{0}));
}

// The last rank's gradient 'b' holds 3 NaNs: every rank raises, naming that rank, 'b' and the
// step, in one collective.
TEST(NonFinite, EveryRankRaisesNamingTheRankParameterAndStep) {
  auto comm = named_comm("nan");
  const int n = comm->size(), r = comm->rank();
  auto f = torch::TensorOptions().device(device());
  NamedTensors grads = {{"a", torch::ones({6}, f)}, {"b", torch::ones({2, 5}, f)}, {"c", torch::ones({3}, f)}};
  const int64_t before = MEASURED(comm->stats()).total_count();
  check_finite(*comm, grads, 6, "gradient");
  EXPECT_EQ(MEASURED(comm->stats()).total_count() - before, 1) << "one collective per check";
  if (r == n - 1) grads[1].second.view({-1}).narrow(0, 4, 3).fill_(std::nan(""));
  const Raised e = raised_by<NonFiniteError>([&] { check_finite(*comm, grads, 7, "gradient"); });
  if (e.raised) {
    EXPECT_EQ(e.finding.kind, "nan");
    EXPECT_EQ(e.finding.ranks, std::vector<int>({n - 1}));
    EXPECT_EQ(e.finding.name, "b");
    EXPECT_EQ(e.finding.step, 7);
    const std::string& m = e.message;
    EXPECT_THAT(m, ::testing::HasSubstr("non-finite gradient 'b'"));
    EXPECT_THAT(m, ::testing::HasSubstr("3 of 10"));
    EXPECT_THAT(m, ::testing::HasSubstr("rank " + std::to_string(n - 1)));
    EXPECT_THAT(m, ::testing::HasSubstr("step 7"));
  }
  EXPECT_TRUE(e.raised) << "every rank must raise, or the others wait in the gradient all-reduce";
  EXPECT_EQ(MEASURED(comm->stats()).total_count() - before, 2);
}

// ---------------------------------------------------------------- Task 6: OOM report

// A model with gradients and optimizer state, an activation held, and an allocation over the
// limit: every live byte at the failure is attributed, the largest tensors named.
TEST(Oom, ReportAttributesLiveBytesToTheirOwners) {
  if (device().is_cuda()) GTEST_SKIP() << "memory limits and tags are CPU-only (dtl/memory.hpp)";
  dtl::model::GPT m(dtl::model::GPTConfig::tiny());
  NamedTensors params, state;
  for (const auto& item : m->named_parameters()) params.emplace_back(item.key(), item.value());
  torch::Tensor tokens = torch::randint(0, 64, {2, 17}, torch::kInt64);
  m->loss(tokens).backward();
  int64_t p_bytes = 0, g_bytes = 0, s_bytes = 0;
  for (const auto& [name, p] : params) {
    state.emplace_back(name + ".exp_avg", torch::zeros_like(p));
    p_bytes += static_cast<int64_t>(p.nbytes());
    g_bytes += static_cast<int64_t>(p.grad().nbytes());
    s_bytes += static_cast<int64_t>(p.nbytes());
  }
  torch::Tensor held;
  {
    dtl::memory::Scope tag("activations");
    held = torch::ones({1000});
  }
  dtl::memory::set_limit(dtl::memory::current_bytes() + (16 << 10));
  std::optional<OomReport> raw;
  std::vector<size_t> thrown;  // the exception's requested, current and limit bytes
  try {
    dtl::memory::Scope tag("activations");
    // Live at the failure, freed by the unwinding before the handler runs: only the
    // exception still knows about its 8000 bytes.
    torch::Tensor temporary = torch::ones({2000});
    torch::Tensor big = torch::empty({1 << 18});
  } catch (const dtl::OutOfMemory& e) {
    dtl::memory::set_limit(0);
    raw = oom_report(e, params, state, 5, "forward", 3);
    thrown = {e.requested_bytes, e.current_bytes, e.limit_bytes};
  }
  dtl::memory::set_limit(0);
  ASSERT_TRUE(OBSERVE(raw.has_value()))
      << "the allocation over the limit did not raise dtl::OutOfMemory";
  // The report is the code's; the allocator's figures are the student's process's (MEASURED).
  const std::optional<OomReport> rep = observed(raw.value_or(OomReport{}));
  thrown = MEASURED(thrown);
  ASSERT_EQ(thrown.size(), 3u);
  EXPECT_EQ(rep->requested, thrown[0]);
  EXPECT_EQ(rep->current, thrown[1]);
  EXPECT_EQ(rep->limit, thrown[2]);
  EXPECT_EQ(rep->activations, static_cast<int64_t>(thrown[1]) - p_bytes - g_bytes - s_bytes);
  EXPECT_EQ(rep->rank, dtl::world().rank());
  EXPECT_EQ(rep->step, 5);
  EXPECT_EQ(rep->phase, "forward");
  EXPECT_EQ(rep->requested, size_t{4} << 18);
  EXPECT_EQ(rep->parameters, p_bytes);
  EXPECT_EQ(rep->gradients, g_bytes);
  EXPECT_EQ(rep->optimizer_state, s_bytes);
  EXPECT_GE(rep->activations, 12000) << "held (4000 bytes) and the temporary (8000) were live at the failure";
  EXPECT_GE(rep->by_tag.at("activations"), 12000u);
  // The three largest: the embedding (64 x 32), its gradient and its state tie at 8 KiB, by name.
  ASSERT_EQ(rep->largest.size(), 3u);
  EXPECT_EQ(rep->largest[0], std::make_pair(std::string("blocks.0.mlp.fc.weight"), int64_t{16384}));
  EXPECT_EQ(rep->largest[1], std::make_pair(std::string("blocks.0.mlp.fc.weight.exp_avg"), int64_t{16384}));
  EXPECT_EQ(rep->largest[2], std::make_pair(std::string("blocks.0.mlp.fc.weight.grad"), int64_t{16384}));
  const Finding f = observed(raw.value_or(OomReport{}).finding());
  EXPECT_EQ(f.kind, "oom");
  EXPECT_EQ(f.ranks, std::vector<int>({dtl::world().rank()}));
  EXPECT_EQ(f.name, "forward");
  EXPECT_EQ(f.step, 5);
  for (const char* word : {"out of memory", "forward", "step 5", "parameters", "gradients", "optimizer state",
                           "activations", "1048576", "blocks.0.mlp.fc.weight"})
    EXPECT_THAT(f.message, ::testing::HasSubstr(word));
  EXPECT_THAT(f.message, ::testing::HasSubstr("rank " + std::to_string(dtl::world().rank())));
}

// ---------------------------------------------------------------- Task 7: replica divergence

// Moves element k (in row-major order) of t by one ULP, in place: its lowest bit flips, as a bit
// flip in memory would do. float32 and bfloat16 (any 4- or 2-byte dtype).
void flip_lowest_bit(const torch::Tensor& t, int64_t k) {
  torch::NoGradGuard no_grad;
  torch::Tensor e = t;
  std::vector<int64_t> index(t.dim());
  for (int64_t d = t.dim() - 1, rest = k; d >= 0; --d) index[d] = rest % t.size(d), rest /= t.size(d);
  for (int64_t i : index) e = e.select(0, i);
  e.view(t.element_size() == 4 ? torch::kInt32 : torch::kInt16).bitwise_xor_(1);
}

// A small model's parameters, the same on every rank: float32 and bfloat16, a transposed view
// and a strided slice among them (parameters need not be contiguous).
NamedTensors replica_params() {
  auto f = torch::TensorOptions().device(device());
  torch::Tensor attn = torch::arange(24, f.dtype(torch::kFloat32)).reshape({4, 6}) / 7;
  torch::Tensor bias = torch::arange(30, f.dtype(torch::kFloat32)).reshape({5, 6}) / 3;
  return {{"wte.weight", torch::linspace(-1, 1, 40, f).reshape({8, 5})},
          {"blocks.0.ln.weight", torch::ones({5}, f)},
          {"blocks.0.attn.weight", attn.t()},
          {"blocks.0.mlp.weight", torch::linspace(0, 3, 60, f).reshape({6, 10}).to(torch::kBFloat16)},
          {"blocks.0.mlp.bias", bias.narrow(1, 1, 3)},
          {"lm_head.weight", torch::linspace(2, -2, 21, f).reshape({3, 7})}};
}

// The hash is FNV-1a of the bytes in row-major order: the published test vectors, then what
// must and must not change it.
TEST(Replicas, ContentHashIsFnv1aOfTheBytesInRowMajorOrder) {
  auto bytes = [](const std::string& s) {
    return torch::tensor(std::vector<int64_t>(s.begin(), s.end()), torch::kInt64).to(torch::kUInt8).to(device());
  };
  EXPECT_EQ(OBSERVE(content_hash(bytes("a"))), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(OBSERVE(content_hash(bytes("foobar"))), 0x85944171f73967e8ULL);
  EXPECT_EQ(OBSERVE(content_hash(torch::empty({0}, torch::TensorOptions().device(device())))),
            0xcbf29ce484222325ULL);
  auto f = torch::TensorOptions().device(device());
  // float32 [1, 2, 3]: the 12 bytes of three little-endian floats (Python: FNV-1a of
  // struct.pack('<3f', 1, 2, 3)).
  torch::Tensor x = torch::tensor({1.0f, 2.0f, 3.0f}).to(device());
  EXPECT_EQ(OBSERVE(content_hash(x)), 0x1de40d89811fe258ULL);
  // Strides are not contents: a transposed view hashes as its contiguous copy.
  torch::Tensor m = torch::arange(12, f.dtype(torch::kFloat32)).reshape({3, 4});
  EXPECT_EQ(OBSERVE(content_hash(m.t())), OBSERVE(content_hash(m.t().contiguous())));
  EXPECT_NE(OBSERVE(content_hash(m.t())), OBSERVE(content_hash(m))) << "same bytes in another order";
  // Swapped elements: a sum of the values would not see it.
  torch::Tensor swapped = torch::tensor({2.0f, 1.0f, 3.0f}).to(device());
  EXPECT_NE(OBSERVE(content_hash(swapped)), OBSERVE(content_hash(x)));
  // One ULP anywhere, in float32 and in bfloat16: far inside any tolerance, still a difference.
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::Tensor t = torch::linspace(-3, 3, 257, f).to(dtype).reshape({257});
    const uint64_t h = OBSERVE(content_hash(t));
    for (int64_t k : {int64_t{0}, int64_t{128}, int64_t{256}}) {
      torch::Tensor u = t.clone();
      flip_lowest_bit(u, k);
      EXPECT_TRUE(torch::allclose(u.to(torch::kFloat64), t.to(torch::kFloat64), 1e-2, 1e-6))
          << "a tolerance cannot tell them apart";
      EXPECT_NE(OBSERVE(content_hash(u)), h) << c10::toString(dtype) << " element " << k;
    }
    EXPECT_EQ(OBSERVE(content_hash(t.clone())), h) << "deterministic";
  }
}

// Equal replicas: no error at any world size, and one collective for all the parameters,
// however many there are.
TEST(Replicas, EqualReplicasPassInOneCollective) {
  auto comm = named_comm("rep");
  NamedTensors params = replica_params();
  int64_t before = MEASURED(comm->stats()).total_count();
  EXPECT_FALSE(raised_by<DivergenceError>([&] { check_replicas(*comm, params, 3); }).raised);
  EXPECT_EQ(MEASURED(comm->stats()).total_count() - before, 1) << "one collective per check";
  auto f = torch::TensorOptions().device(device());
  NamedTensors many;
  for (int i = 0; i < 64; ++i) many.emplace_back(fmt::format("p{}", i), torch::full({3}, i * 0.5, f));
  before = MEASURED(comm->stats()).total_count();
  EXPECT_FALSE(raised_by<DivergenceError>([&] { check_replicas(*comm, many, 4); }).raised);
  EXPECT_EQ(MEASURED(comm->stats()).total_count() - before, 1) << "64 parameters, still one collective";
  // A rank whose parameter is a transposed view holds the same model as one with its copy.
  if (comm->rank() == 0) params[2].second = params[2].second.contiguous();
  EXPECT_FALSE(raised_by<DivergenceError>([&] { check_replicas(*comm, params, 5); }).raised)
      << "the same bytes in another layout";
}

// The last rank's copy of one parameter is one ULP off at one element (first, middle or last
// parameter; first, middle or last element; float32, bfloat16, non-contiguous): every rank
// raises, naming that parameter and that rank, in one collective.
TEST(Replicas, OneUlpOnOneRankIsNamedWithItsParameterAndRank) {
  auto comm = named_comm("rep1");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a divergence needs a second replica";
  std::vector<int> others;
  for (int k = 0; k < n - 1; ++k) others.push_back(k);
  for (size_t p : {size_t{0}, size_t{2}, size_t{3}, size_t{4}, size_t{5}}) {
    const int64_t numel = replica_params()[p].second.numel();
    for (int64_t k : {int64_t{0}, numel / 2, numel - 1}) {
      NamedTensors params = replica_params();
      if (r == n - 1) flip_lowest_bit(params[p].second, k);
      const int64_t before = MEASURED(comm->stats()).total_count();
      const Raised e = raised_by<DivergenceError>([&] { check_replicas(*comm, params, 9); });
      const std::string where = fmt::format("parameter {} ('{}'), element {}", p, params[p].first, k);
      EXPECT_TRUE(e.raised) << where << ": every rank must raise";
      if (e.raised) {
        EXPECT_EQ(e.finding.kind, "divergence") << where;
        EXPECT_EQ(e.finding.name, params[p].first) << where;
        EXPECT_EQ(e.finding.ranks, std::vector<int>({n - 1})) << where;
        EXPECT_EQ(e.finding.step, 9) << where;
        EXPECT_THAT(e.message, ::testing::HasSubstr("replicas diverge")) << where;
        EXPECT_THAT(e.message, ::testing::HasSubstr("'" + params[p].first + "'")) << where;
        EXPECT_THAT(e.message, ::testing::HasSubstr("step 9")) << where;
        EXPECT_THAT(e.message, ::testing::HasSubstr(format_ranks({n - 1}))) << where;
        EXPECT_THAT(e.message, ::testing::HasSubstr(format_ranks(others))) << where;
        EXPECT_THAT(e.message, ::testing::HasSubstr("1 of 6")) << where;
      }
      EXPECT_EQ(MEASURED(comm->stats()).total_count() - before, 1) << where;
    }
  }
}

// Several parameters differ, on several ranks: the first in the model's order is named, with
// every rank outside its majority; swapped elements are a difference too.
TEST(Replicas, TheFirstDifferingParameterAndEveryOddRank) {
  auto comm = named_comm("rep2");
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a divergence needs a second replica";
  // The last rank's lm_head.weight (parameter 5) and wte.weight (parameter 0) are off: the
  // first in order is named, and the count says how many differ.
  NamedTensors params = replica_params();
  if (r == n - 1) flip_lowest_bit(params[5].second, 3), flip_lowest_bit(params[0].second, 39);
  Raised e = raised_by<DivergenceError>([&] { check_replicas(*comm, params, 2); });
  EXPECT_TRUE(e.raised);
  EXPECT_EQ(e.finding.name, "wte.weight");
  EXPECT_EQ(e.finding.ranks, std::vector<int>({n - 1}));
  EXPECT_THAT(e.message, ::testing::HasSubstr("2 of 6"));
  // Two elements of blocks.0.ln.weight swapped on the last rank: a sum would not notice.
  params = replica_params();
  if (r == n - 1) params[1].second.copy_(torch::tensor({1.0f, 2.0f, 1.0f, 1.0f, 1.0f}).to(device()));
  else params[1].second.copy_(torch::tensor({2.0f, 1.0f, 1.0f, 1.0f, 1.0f}).to(device()));
  e = raised_by<DivergenceError>([&] { check_replicas(*comm, params, 2); });
  EXPECT_TRUE(e.raised) << "the same values in another order are another parameter";
  EXPECT_EQ(e.finding.name, "blocks.0.ln.weight");
  EXPECT_EQ(e.finding.ranks, std::vector<int>({n - 1}));
  if (n < 3) return;
  // Every rank from 2 on is off in blocks.0.mlp.bias, each its own way; rank 1 in lm_head.weight.
  // Ranks 0 and 1 agree on the first differing parameter: with 3 ranks they are the majority
  // against rank 2; with 4, ranks 2 and 3 each hold a copy of their own.
  params = replica_params();
  if (r >= 2) flip_lowest_bit(params[4].second, r - 2);
  if (r == 1) flip_lowest_bit(params[5].second, 0);
  e = raised_by<DivergenceError>([&] { check_replicas(*comm, params, 8); });
  EXPECT_TRUE(e.raised);
  std::vector<int> odd;
  for (int k = 2; k < n; ++k) odd.push_back(k);
  EXPECT_EQ(e.finding.name, "blocks.0.mlp.bias");
  EXPECT_EQ(e.finding.ranks, odd);
  EXPECT_THAT(e.message, ::testing::HasSubstr(format_ranks(odd)));
  EXPECT_THAT(e.message, ::testing::HasSubstr("2 of 6"));
}

// ---------------------------------------------------------------- faults: new processes

// 3 ranks; rank 1 skips the gradient all-reduce of step 1 (grads #6) and waits in the metrics
// all-reduce: the report names rank 1 as the one that never issued grads #6.
TEST(Faults, SkippedCollectiveIsNamed) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("skip (3 ranks)", 3, "skip", 1);
  expect_culprit(r, "missing", {1}, "grads", grads_allreduce_seq(1));
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1, 2}));
}

// 2 ranks in desync check mode; rank 1's gradient buffer has one element more.
TEST(Faults, ShapeMismatchIsCaughtBeforeTheCollective) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("shape (2 ranks, desync check)", 2, "shape", 1, /*desync=*/true);
  expect_culprit(r, "desync", {1}, "grads", grads_allreduce_seq(1, /*desync=*/true));
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1}));
}

// 2 ranks; rank 1 sleeps past the timeout before the gradient all-reduce.
TEST(Faults, SleepingRankIsAStraggler) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("sleep (2 ranks)", 2, "sleep", 1);
  expect_culprit(r, "straggler", {1}, "grads", grads_allreduce_seq(1));
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1}));
}

// 3 ranks; rank 1 is killed (SIGKILL) before the gradient all-reduce: no dump from it.
TEST(Faults, CrashedRankIsNamedDead) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("crash (3 ranks)", 3, "crash", 1);
  expect_culprit(r, "dead", {1}, "grads", grads_allreduce_seq(1));
  EXPECT_EQ(r.dumps, std::vector<int>({0, 2}));
}

// 2 ranks; rank 1 runs out of memory in the forward of step 1.
TEST(Faults, OutOfMemoryIsReported) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  if (device().is_cuda()) GTEST_SKIP() << "memory limits are CPU-only (dtl/memory.hpp)";
  const FaultRun r = fault_job("oom (2 ranks)", 2, "oom", 1);
  expect_culprit(r, "oom", {1});
  EXPECT_EQ(r.first.step, 1);
  EXPECT_EQ(r.first.name, "forward");
  EXPECT_THAT(r.first.message, ::testing::HasSubstr("activations"));
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1}));
}

// 4 ranks; a NaN in rank 2's gradient of blocks.0.mlp.fc.weight in step 1.
TEST(Faults, NanGradientIsTracedToItsRankAndParameter) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("nan (4 ranks)", 4, "nan", 2);
  expect_culprit(r, "nan", {2});
  EXPECT_EQ(r.first.name, "blocks.0.mlp.fc.weight");
  EXPECT_EQ(r.first.step, 1);
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1, 2, 3}));
}

// 3 ranks; one bit of rank 2's blocks.0.mlp.fc.weight flips after the optimizer step of step 1.
// Without the replica check the job trains to the end and nothing notices; with it, the report
// names the parameter, the rank and the step.
TEST(Faults, FlippedBitIsSilentUntilTheReplicasAreCompared) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun silent = fault_job("flip (3 ranks, no replica check)", 3, "flip", 2);
  EXPECT_TRUE(silent.job.ok()) << silent.job.describe();
  EXPECT_THAT(silent.job.output, ::testing::HasSubstr("no culprit"));
  EXPECT_FALSE(silent.trigger);
  const FaultRun r = fault_job("flip (3 ranks, replica check)", 3, "flip", 2, false, /*replica=*/true);
  expect_culprit(r, "divergence", {2});
  EXPECT_EQ(r.first.name, "blocks.0.mlp.fc.weight");
  EXPECT_EQ(r.first.step, 1);
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1, 2}));
}

// Without a fault the job trains to the end, every rank dumps on demand, nothing is wrong.
TEST(Faults, HealthyRunEndsWithNoCulprit) {
  LAB18_ONLY_AT_WORLD_SIZE_1();
  const FaultRun r = fault_job("none (2 ranks)", 2, "", 1);
  EXPECT_TRUE(r.job.ok()) << r.job.describe();
  EXPECT_THAT(r.job.output, ::testing::HasSubstr("no culprit"));
  EXPECT_FALSE(r.trigger);
  EXPECT_EQ(r.dumps, std::vector<int>({0, 1}));
  EXPECT_EQ(r.reasons.at(1), "on demand: end of run");
}

}  // namespace
}  // namespace lab18_test
