// The summary of `./lab test NN` (summary.hpp).
#include "summary.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "results.hpp"

using nlohmann::json;

namespace dtl::grade {

namespace {

// The harness's watchdog marks the test it stopped with a failure that starts with this.
constexpr const char* kWatchdog = "[dtl watchdog]";
constexpr char kRankMark = '\x01';  // stands for "this failure's rank" in a message being compared

// One distinct failure of one test at one world size, and the ranks it happened on.
struct Failure {
  std::string where;  // "labs/02_data_parallel/tests/data_parallel_test.cpp:136", or ""
  std::string body;   // the message, its own rank written as kRankMark
  std::vector<int> ranks;
};

struct Row {
  std::map<int, std::string> cells;              // world size -> ok, FAIL, n.i., HANG, skip
  std::map<int, std::vector<Failure>> failures;  // world size -> distinct failures, in order
};

// gtest's "file:line\nmessage"; a failure re-raised by rank 0 for rank r reads
// "file:line\nFailed\n[rank r/n] message". The location loses the "../" of a build directory.
Failure parse_failure(const std::string& raw, int& rank) {
  static const std::regex reraised(R"(^Failed\n\[rank (\d+)/\d+\] )");
  static const std::regex location(R"(^\S+:\d+$)");
  const std::string text = plain(raw);
  Failure f;
  const size_t nl = text.find('\n');
  std::string first = text.substr(0, nl);
  if (std::regex_match(first, location)) {
    while (first.rfind("../", 0) == 0) first.erase(0, 3);
    f.where = first;
    f.body = nl == std::string::npos ? "" : text.substr(nl + 1);
  } else {
    f.body = text;
  }
  rank = 0;
  std::smatch m;
  if (std::regex_search(f.body, m, reraised)) {
    rank = std::stoi(m[1].str());
    f.body = m.suffix().str();
  }
  // "... (this is rank 1)" on rank 1 and "... (this is rank 0)" on rank 0 are the same failure.
  const std::regex own_rank("\\brank " + std::to_string(rank) + "\\b");
  f.body = std::regex_replace(f.body, own_rank, std::string("rank ") + kRankMark);
  while (!f.body.empty() && f.body.back() == '\n') f.body.pop_back();
  return f;
}

// 0,1,2,3 -> "0-3"; 0,2 -> "0,2".
std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// The message as a student reads it: its own rank written back, gtest's "Expected: true" after
// "Actual: false (...)" left out (the line above already says it), long lines and long messages
// cut (the log has them whole).
std::string readable(const Failure& f, const std::string& indent) {
  std::string body = f.body;
  const std::string ranks = rank_list(f.ranks);
  for (size_t p; (p = body.find(kRankMark)) != std::string::npos;) body.replace(p, 1, ranks);
  std::istringstream in(body);
  std::vector<std::string> lines;
  if (!f.where.empty()) lines.push_back(f.where);
  for (std::string line; std::getline(in, line);) {
    if (line == "Expected: true" && !lines.empty() && lines.back().rfind("  Actual: false", 0) == 0)
      continue;
    lines.push_back(line.size() > 400 ? line.substr(0, 400) + "..." : line);
  }
  std::string out;
  const size_t max_lines = 12;
  for (size_t i = 0; i < lines.size() && i < max_lines; ++i) out += indent + lines[i] + "\n";
  if (lines.size() > max_lines) out += indent + "... (the rest in the log)\n";
  return out;
}

// The output ctest printed for one entry (--output-on-failure): from its result line to the next
// entry's line. For a run that left no report (a crash): its last lines.
std::string log_tail(const std::string& log, const std::string& entry, size_t lines) {
  std::ifstream in(log);
  if (!in) return "";
  const std::regex start(R"(^\s*\d+/\d+ Test\s+#\d+: (\S+) )");
  const std::regex next(R"(^\s*(Start\s+\d+:|\d+/\d+ Test\s+#\d+:|\d+% tests passed))");
  std::vector<std::string> block;
  bool on = false;
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (on && std::regex_search(line, next)) break;
    if (on) block.push_back(plain(line));
    if (!on && std::regex_search(line, m, start) && m[1].str() == entry) on = true;
  }
  while (!block.empty() && block.back().find_first_not_of(" \t-") == std::string::npos)
    block.pop_back();
  std::string out;
  for (size_t i = block.size() > lines ? block.size() - lines : 0; i < block.size(); ++i)
    out += "    " + block[i] + "\n";
  return out;
}

}  // namespace

int summarize(const std::string& dir, const std::vector<std::string>& names,
              const std::string& log) {
  std::vector<std::string> order;  // tests in the order they ran (the handout's task order)
  std::map<std::string, Row> rows;
  std::set<std::string> todo;  // "lab 03: ring_all_reduce (Task 4)", once each
  std::vector<std::string> missing;
  std::set<int> worlds;
  for (const auto& name : names) {
    const auto dot = name.rfind(".n");
    const int n = dot == std::string::npos ? 0 : std::atoi(name.c_str() + dot + 2);
    worlds.insert(n);
    std::ifstream in(dir + "/" + name + ".json");
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("testsuites")) {
      missing.push_back(name);
      continue;
    }
    for (auto& suite : j["testsuites"])
      for (auto& t : suite.value("testsuite", json::array())) {
        const std::string test = suite.value("name", "") + "." + t.value("name", "");
        if (!rows.count(test)) order.push_back(test);
        Row& row = rows[test];
        std::string verdict = "ok";
        if (t.value("result", "") == "SKIPPED") verdict = "skip";
        if (t.contains("failures") && !t["failures"].empty()) {
          const std::string msg = t["failures"][0].value("failure", "failed");
          const std::string ni = not_implemented_reason(msg);
          verdict = !ni.empty()                                ? "n.i."
                    : msg.find(kWatchdog) != std::string::npos ? "HANG"
                                                               : "FAIL";
          if (!ni.empty()) todo.insert(ni.substr(std::string("not implemented: ").size()));
          // Each failure once: the same one on several ranks is one entry naming them.
          auto& list = row.failures[n];
          for (auto& raw : t["failures"]) {
            int rank = 0;
            Failure f = parse_failure(raw.value("failure", "failed"), rank);
            auto same = std::find_if(list.begin(), list.end(), [&](const Failure& g) {
              return g.where == f.where && g.body == f.body;
            });
            if (same == list.end()) {
              f.ranks = {rank};
              list.push_back(f);
            } else if (std::find(same->ranks.begin(), same->ranks.end(), rank) ==
                       same->ranks.end()) {
              same->ranks.push_back(rank);
            }
          }
        }
        row.cells[n] = verdict;
      }
  }
  size_t width = 10;
  for (auto& test : order) width = std::max(width, test.size());
  std::string out = fmt::format("\n{:<{}}", "test", width);
  for (int n : worlds) out += fmt::format(" {:>5}", fmt::format("n={}", n));
  out += "\n";
  int ok = 0;
  bool not_run = false;
  std::vector<std::string> failing;
  for (auto& test : order) {
    const Row& row = rows[test];
    out += fmt::format("{:<{}}", test, width);
    bool all_ok = true, real_failure = false;
    for (int n : worlds) {
      auto it = row.cells.find(n);
      const std::string v = it == row.cells.end() ? "-" : it->second;
      all_ok = all_ok && (v == "ok" || v == "skip");
      not_run = not_run || v == "-";
      real_failure = real_failure || v == "FAIL" || v == "HANG";
      out += fmt::format(" {:>5}", v);
    }
    out += "\n";
    ok += all_ok;
    if (real_failure) failing.push_back(test);
  }
  out += fmt::format("{} of {} tests pass at every world size\n", ok, order.size());
  if (not_run) out += "- = did not run (the run ended before it: a hang or a crash)\n";
  if (!todo.empty()) {
    out += "n.i. = not implemented yet:\n";
    for (auto& t : todo) out += "  " + t + "\n";
  }
  // Each failing test: where it fails, and its first failure, whole and once.
  for (auto& test : failing) {
    const Row& row = rows.at(test);
    std::vector<int> at;
    for (auto& [n, v] : row.cells)
      if (v == "FAIL" || v == "HANG") at.push_back(n);
    const int first_n = at.front();
    const Failure& first = row.failures.at(first_n).front();
    const size_t ranks = first.ranks.size();
    const std::string on = first_n <= 1 ? ""
                           : static_cast<int>(ranks) == first_n
                               ? fmt::format(", on all {} ranks", first_n)
                               : fmt::format(", on rank{} {} of {}", ranks > 1 ? "s" : "",
                                             rank_list(first.ranks), first_n);
    if (first.body.find(kWatchdog) == 0)
      out += fmt::format("\n{} hangs at n={}, stopped by the watchdog:\n", test, first_n);
    else
      out += fmt::format("\n{} fails at n={}; first failure at n={}{}:\n", test,
                         fmt::join(at, ", "), first_n, on);
    out += readable(first, "    ");
    std::vector<std::string> more;
    size_t others = 0;
    for (int n : at) {
      const size_t k = row.failures.at(n).size() - (n == first_n ? 1 : 0);
      if (k > 0) more.push_back(fmt::format("n={}: {}", n, k));
      others += k;
    }
    if (others > 0)
      out += fmt::format("    + {} other failure{} of this test ({}): in the log\n", others,
                         others > 1 ? "s" : "", fmt::join(more, ", "));
  }
  for (auto& name : missing) {
    out += fmt::format("\n{}: no test report (the run crashed, or was not built)", name);
    const std::string tail = log.empty() ? "" : log_tail(log, name, 12);
    out += tail.empty() ? "\n" : "; its last lines:\n" + tail;
  }
  if (!log.empty()) out += fmt::format("\nfull output of every run: {}\n", log);
  std::cout << out << std::flush;
  return ok == static_cast<int>(order.size()) && missing.empty() ? 0 : 1;
}

}  // namespace dtl::grade
