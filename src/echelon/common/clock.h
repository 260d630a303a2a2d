// Clock: time enters through this interface so that the scheduler and simulator run the
// same decisions against real or simulated time.
//
//   RealClock clock;            SimulatedClock sim;
//   double t = clock.Now();     sim.Advance(2.5);   // seconds
//
// Thread contract: RealClock is stateless; SimulatedClock guards its time with a mutex.
#pragma once

#include <chrono>
#include <mutex>

namespace echelon {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary, fixed origin; monotonic.
  virtual double Now() const = 0;
};

class RealClock : public Clock {
 public:
  double Now() const override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
};

class SimulatedClock : public Clock {
 public:
  explicit SimulatedClock(double start = 0.0) : now_(start) {}
  double Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += seconds;
  }
  void Set(double t) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ = t;
  }

 private:
  mutable std::mutex mu_;  // guards now_
  double now_;
};

}  // namespace echelon
