// The websocket policy server: openpi's protocol (src/openpi/serving/websocket_policy_server.py) on Boost.Beast.
//   connect  → the server sends one binary frame: the policy metadata (msgpack map)
//   request  → binary frame: the observation (msgpack-numpy map)
//   answer   ← binary frame: {actions, policy_timing: {infer_ms}, server_timing: {infer_ms, prev_total_ms}}, and
//              rtc: {mode, delay} when the request carried a previous chunk (robot_profile.h; clients ignore it)
//   bad input← a text frame with one line, then close 1011 (what openpi does; its client raises the text); a
//              frame over max_frame_bytes is bad input too
//   GET /healthz → 200 "OK"
// Beyond openpi: --api-key refuses a handshake without "Authorization: Api-Key <key>" (401), --max-clients
// refuses connections past the limit (503), and clients are served concurrently (openpi serves one at a time):
// each connection reads, decodes and prepares its observation on the I/O threads, the model runs on the policy's
// own thread (policy.h), and every write is asynchronous, so a slow or dead client holds only its own connection.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "pi0/serve/policy.h"

namespace pi0::serve {

struct ServerOptions {
  std::string host = "0.0.0.0";          ///< bind address; 127.0.0.1 keeps the server local
  uint16_t port = 8000;                  ///< 0 = any free port (see Server::port())
  std::string api_key;                   ///< empty = no check
  int64_t max_clients = 64;              ///< open websocket connections at a time
  int64_t io_threads = 2;                ///< threads that read, decode and prepare observations
  size_t max_frame_bytes = 256u << 20;   ///< larger frames get the error text frame and close 1011 (--max-frame-mb)
  int64_t idle_timeout_s = 60;           ///< a connection that answers no ping for this long is dropped
};

class Server {
 public:
  /// Binds host:port (UserError naming --host/--port when that fails). Serves nothing until run().
  Server(Policy& policy, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The bound port (the chosen one when options.port was 0).
  uint16_t port() const;
  /// Serves until stop() or, with `handle_signals`, SIGINT/SIGTERM (also one that set pi0::request_interrupt()
  /// before run() took the signals over); then closes every connection (1001) and returns once they are closed
  /// (at most a few seconds).
  void run(bool handle_signals);
  /// Thread-safe; run() returns soon after.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pi0::serve
