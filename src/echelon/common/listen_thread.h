// ListenThread: runs an HTTP server's accept loop (cpp-httplib's listen_after_bind) on its own
// thread, and stops it even when Stop comes before the loop has started: httplib's stop()
// at that point is lost, and joining would then wait for a loop nobody stops.
//
//   port = server.bind_to_any_port("127.0.0.1");
//   listen.Start(&server);  ...  listen.Stop();
//
// Thread contract: Start and Stop from one owning thread; Wait may block any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace echelon {

template <typename Server>
class ListenThread {
 public:
  ~ListenThread() { Stop(); }

  void Start(Server* server) {
    server_ = server;
    returned_ = false;
    thread_ = std::thread([this] {
      server_->listen_after_bind();
      returned_ = true;
    });
  }

  // Stops the loop (once it has started, or returned by itself) and joins it.
  void Stop() {
    if (!thread_.joinable()) return;
    while (!server_->is_running() && !returned_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    server_->stop();
    thread_.join();
  }

  // Waits until the loop ends (another thread stopped the server).
  void Wait() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  Server* server_ = nullptr;
  std::atomic<bool> returned_{false};
  std::thread thread_;
};

}  // namespace echelon
