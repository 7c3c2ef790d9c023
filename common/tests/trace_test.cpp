// Tests of tracing: recorded events, the Chrome trace file, the time accounting and the Gantt.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "dtl/perf.hpp"
#include "dtl/net.hpp"
#include "dtl/runtime.hpp"
#include "dtl/trace.hpp"

namespace {

using ::testing::HasSubstr;

struct TraceGuard {
  TraceGuard() {
    dtl::trace::clear();
    dtl::trace::enable(true);
  }
  ~TraceGuard() {
    dtl::trace::enable(false);
    dtl::trace::clear();
  }
};

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(Trace, ScopesAndCommOpsAreRecorded) {
  TraceGuard guard;
  auto& w = dtl::world();
  {
    DTL_SCOPE("forward");
    sleep_ms(2);
  }
  auto t = torch::ones({16});
  uint64_t seq = w.ops_issued() + 1;
  w.all_reduce(t);
  auto evs = dtl::trace::events();
  ASSERT_EQ(evs.size(), 2u);
  EXPECT_EQ(evs[0].name, "forward");
  EXPECT_EQ(evs[0].cat, "compute");
  EXPECT_GE(evs[0].end - evs[0].start, 0.002);
  EXPECT_EQ(evs[1].name, "all_reduce #" + std::to_string(seq));
  EXPECT_EQ(evs[1].track, "comm world");
  EXPECT_THAT(evs[1].args, HasSubstr("\"bytes\":64"));
  EXPECT_LE(evs[0].end, evs[1].start);
}

TEST(Trace, OffRecordsNothing) {
  dtl::trace::clear();
  {
    DTL_SCOPE("ignored");
  }
  dtl::world().barrier();
  EXPECT_TRUE(dtl::trace::events().empty());
}

TEST(Trace, ChromeTraceFileIsValidWithOneProcessPerRank) {
  TraceGuard guard;
  auto& w = dtl::world();
  auto sub = w.split(w.rank() % 2, w.rank());
  {
    DTL_SCOPE("step");
    auto t = torch::ones({8});
    w.all_reduce(t);
    sub->all_reduce(t);
  }
  // Rank 0 names the file; everyone writes through the collective.
  int64_t pid = getpid();
  auto name = torch::tensor({pid});
  w.broadcast(name, 0);
  std::string path = "/tmp/dtl_trace_test_" + std::to_string(name.item<int64_t>()) + ".json";
  dtl::trace::write_chrome(path);
  if (w.rank() != 0) return;
  std::ifstream f(path);
  ASSERT_TRUE(f.good());
  auto doc = nlohmann::json::parse(f, nullptr, false);
  std::remove(path.c_str());
  ASSERT_FALSE(doc.is_discarded()) << "trace is not valid JSON";
  ASSERT_TRUE(doc.contains("traceEvents"));
  std::set<int> ranks_named, ranks_with_step;
  std::set<std::string> threads;
  int comm_events = 0;
  for (auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ranks_named.insert(e["pid"].get<int>());
    if (e["ph"] == "M" && e["name"] == "thread_name")
      threads.insert(std::to_string(e["pid"].get<int>()) + ":" + e["args"]["name"].get<std::string>());
    if (e["ph"] == "X") {
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      if (e["name"] == "step") ranks_with_step.insert(e["pid"].get<int>());
      if (e["cat"] == "comm") ++comm_events;
    }
  }
  EXPECT_EQ(static_cast<int>(ranks_named.size()), w.size());
  EXPECT_EQ(static_cast<int>(ranks_with_step.size()), w.size());
  EXPECT_EQ(comm_events, 4 * w.size()) << "per rank: split, two all-reduces, the broadcast";
  for (int r = 0; r < w.size(); ++r) {
    EXPECT_TRUE(threads.count(std::to_string(r) + ":compute")) << "rank " << r;
    EXPECT_TRUE(threads.count(std::to_string(r) + ":comm world")) << "rank " << r;
    EXPECT_TRUE(threads.count(std::to_string(r) + ":comm world/split(" + std::to_string(r % 2) + ")"));
  }
}

TEST(Trace, SummaryAccountsOverlap) {
  using dtl::trace::Event;
  // Hand-made timeline: compute [0,10] and [20,30]; comm [5,25].
  std::vector<Event> evs = {{"f", "compute", "compute", 0, 10, 0, ""},
                            {"b", "compute", "compute", 20, 30, 0, ""},
                            {"all_reduce #1", "comm world", "comm", 5, 25, 0, ""}};
  auto s = dtl::trace::summary(evs);
  EXPECT_DOUBLE_EQ(s.wall, 30);
  EXPECT_DOUBLE_EQ(s.compute, 20);
  EXPECT_DOUBLE_EQ(s.comm, 20);
  EXPECT_DOUBLE_EQ(s.exposed_comm, 10);  // [10,20]
  auto window = dtl::trace::summary(evs, 0, 15);
  EXPECT_DOUBLE_EQ(window.exposed_comm, 5);
}

TEST(Trace, ExposedCommEqualsStepMinusCompute) {
  auto& w = dtl::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  dtl::net::set(dtl::net::Spec::parse("intra=20MB/s,2ms"));
  TraceGuard guard;
  auto g = torch::ones({100'000});  // 400 KB: ~20-40 ms emulated
  dtl::control_barrier();
  double t0 = dtl::trace::now();
  {
    DTL_SCOPE("compute");
    sleep_ms(30);
  }
  w.all_reduce(g);  // blocking: fully exposed
  double step = dtl::trace::now() - t0;
  dtl::net::set(dtl::net::Spec{});
  auto s = dtl::trace::summary();
  EXPECT_NEAR(s.exposed_comm, step - s.compute, 0.10 * step)
      << s.to_string() << ", step " << step * 1e3 << " ms";
  EXPECT_GT(s.exposed_comm, 0.015);
}

TEST(Trace, GanttDrawsARowPerRankAndTrack) {
  using dtl::trace::Event;
  std::vector<Event> evs = {{"F0", "compute", "compute", 0, 1, 0, ""},
                            {"B0", "compute", "compute", 1, 3, 1, ""},
                            {"send #1", "comm world", "comm", 1, 2, 0, ""}};
  std::string g = dtl::trace::gantt(evs, 30);
  EXPECT_THAT(g, HasSubstr("rank 0  compute   |FF0"));
  EXPECT_THAT(g, HasSubstr("rank 1  compute   |..........BB0"));
  EXPECT_THAT(g, HasSubstr("rank 0 comm world |..........=send #1"));
  EXPECT_THAT(g, HasSubstr("F0"));
  EXPECT_THAT(g, HasSubstr("=send #1"));
  EXPECT_THAT(g, HasSubstr("3000.00 ms"));
}

}  // namespace
