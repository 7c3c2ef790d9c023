// dtl/timer.hpp — defines: now_seconds, Timer.
#pragma once

#include <chrono>

namespace dtl {

// Monotonic wall-clock seconds (steady_clock); comparable across threads of one process.
inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Timer t; ...; t.seconds(): elapsed wall time since construction or the last reset().
class Timer {
 public:
  Timer() : start_(now_seconds()) {}
  void reset() { start_ = now_seconds(); }
  double seconds() const { return now_seconds() - start_; }
  double millis() const { return seconds() * 1e3; }

 private:
  double start_;
};

}  // namespace dtl
