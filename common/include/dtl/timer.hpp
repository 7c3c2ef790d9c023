// dtl/timer.hpp — defines: now_seconds, Timer, DeviceTimer.
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

void synchronize_device();  // dtl/perf.hpp: waits for the Runtime's device (no-op on CPU)

// A Timer for work that may run on a GPU: it waits for the Runtime's device when it starts and
// when it is read. CUDA kernels are queued and return at once, so a host clock alone would time
// the launches, not the work. On the CPU (and before the Runtime exists) it is a plain Timer.
// Reading it synchronises the device: time phases, not inner loops.
class DeviceTimer {
 public:
  DeviceTimer() { reset(); }
  void reset() {
    synchronize_device();
    timer_.reset();
  }
  double seconds() const {
    synchronize_device();
    return timer_.seconds();
  }
  double millis() const { return seconds() * 1e3; }

 private:
  Timer timer_;
};

}  // namespace dtl
