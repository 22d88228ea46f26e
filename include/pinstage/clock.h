// The one clock: a steady stopwatch for every timing pinstage reports.
#pragma once

#include <chrono>

namespace pinstage {

using Clock = std::chrono::steady_clock;

// Seconds elapsed since `start`.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Started on construction; seconds() reads it, restart() returns the reading and resets.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  double seconds() const { return seconds_since(start_); }
  double restart() {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - start_).count();
    start_ = now;
    return s;
  }

 private:
  Clock::time_point start_;
};

}  // namespace pinstage
