// Clock: time and sleeping enter through this interface so that the scheduler, the simulator,
// the actor loop and the learner loop run the same decisions against real or simulated time.
//
//   RealClock clock;            SimulatedClock sim;
//   double t = clock.Now();     sim.Advance(2.5);   // seconds
//   clock.SleepFor(0.05);       sim.SleepFor(0.05); // sleeps; advances simulated time
//
// Thread contract: RealClock is stateless; SimulatedClock guards its time with a mutex.
#pragma once

#include <chrono>
#include <mutex>
#include <thread>

namespace echelon {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary, fixed origin; monotonic.
  virtual double Now() const = 0;
  // Returns after `seconds` of this clock's time have passed.
  virtual void SleepFor(double seconds) const = 0;
};

class RealClock : public Clock {
 public:
  double Now() const override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
  void SleepFor(double seconds) const override {
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
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
  // The sleeper moves simulated time itself: a single-threaded loop under test runs through
  // its waits at once. (Threads that must wait for each other need their own coordination.)
  void SleepFor(double seconds) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (seconds > 0) now_ += seconds;
  }
  void Set(double t) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ = t;
  }

 private:
  mutable std::mutex mu_;  // guards now_
  mutable double now_;
};

}  // namespace echelon
