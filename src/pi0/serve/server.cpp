#include "pi0/serve/server.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <list>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/interrupt.h"
#include "pi0/common/strings.h"

namespace pi0::serve {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// openpi's reason for the 1011 close after the error text (websocket_policy_server.py).
constexpr const char* kCloseReason = "Internal server error. Error included in previous frame.";

// LibTorch's errors carry a C++ backtrace; the client gets the message only.
std::string error_text(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// One line, and short: a message can quote the client's keys, which may be of any length.
// A text frame must be valid UTF-8 and the log line one line: escaped (a key may hold any bytes) and bounded.
std::string one_line(const std::string& s) {
  constexpr size_t kMax = 2000;
  return s.size() > kMax ? printable(s.substr(0, kMax)) + "..." : printable(s);
}

class Session;

}  // namespace

struct Server::Impl {
  Policy& policy;
  ServerOptions options;
  // Declared before ioc: handlers destroyed with ioc may still touch these.
  std::mutex mutex;
  std::list<std::weak_ptr<Session>> sessions;
  int64_t clients = 0;                 // accepted websocket connections open now
  std::atomic<int64_t> in_flight{0};   // requests queued on the policy whose answer has not been posted yet
  bool stopped = false;                // on `strand` only

  net::io_context ioc;
  net::strand<net::io_context::executor_type> strand{ioc.get_executor()};  // acceptor, signals, stop
  tcp::acceptor acceptor{strand};
  net::signal_set signals{strand};
  net::steady_timer grace{strand};
  net::steady_timer retry{strand};  // accept() after an accept error
  std::vector<std::shared_ptr<std::function<void()>>> polls;  // do_stop's wait for the last connection

  Impl(Policy& p, ServerOptions o) : policy(p), options(std::move(o)) {}

  bool add_client() {
    std::lock_guard<std::mutex> lock(mutex);
    if (clients >= options.max_clients) return false;
    ++clients;
    return true;
  }
  void remove_client() {
    std::lock_guard<std::mutex> lock(mutex);
    --clients;
  }
  void accept();
  void do_stop();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, Server::Impl& server) : ws_(std::move(socket)), server_(server) {
    beast::error_code ec;
    ws_.next_layer().socket().set_option(tcp::no_delay(true), ec);  // answers go out at once, not after 40 ms
    remote_ = endpoint_str(ws_.next_layer().socket());
  }
  ~Session() {
    if (counted_) server_.remove_client();
  }

  void start() {
    net::dispatch(ws_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  /// Closes with 1001 (going away) once the current answer is written.
  void shutdown() {
    net::post(ws_.get_executor(), [self = shared_from_this()] {
      self->stopping_ = true;
      if (!self->busy_ && self->accepted_) self->close(websocket::close_code::going_away, "server shutting down");
      else if (!self->accepted_) beast::get_lowest_layer(self->ws_).close();
    });
  }

 private:
  static std::string endpoint_str(const tcp::socket& s) {
    beast::error_code ec;
    const auto ep = s.remote_endpoint(ec);
    return ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void read_request() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(16 * 1024);
    beast::get_lowest_layer(ws_).expires_after(std::chrono::seconds(30));
    http::async_read(ws_.next_layer(), http_buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (ec) return;  // closed or timed out before a full request
    auto req = parser_->release();
    if (req.target() == "/healthz") return respond(http::status::ok, "OK\n", req.version());
    if (!websocket::is_upgrade(req))
      return respond(http::status::bad_request, "expected a websocket upgrade (or GET /healthz)\n", req.version());
    const auto& key = server_.options.api_key;
    if (!key.empty() && req[http::field::authorization] != "Api-Key " + key) {
      spdlog::warn("pi0-serve: {} refused: missing or wrong API key", remote_);
      return respond(http::status::unauthorized, "missing or wrong 'Authorization: Api-Key <key>' header\n", req.version());
    }
    if (!server_.add_client()) {
      spdlog::warn("pi0-serve: {} refused: {} clients connected (--max-clients)", remote_, server_.options.max_clients);
      return respond(http::status::service_unavailable,
                     "server full: " + std::to_string(server_.options.max_clients) + " clients connected (--max-clients)\n",
                     req.version());
    }
    counted_ = true;
    beast::get_lowest_layer(ws_).expires_never();  // the websocket's own timeouts from here on
    websocket::stream_base::timeout t = websocket::stream_base::timeout::suggested(beast::role_type::server);
    t.idle_timeout = std::chrono::seconds(server_.options.idle_timeout_s);
    t.keep_alive_pings = true;
    ws_.set_option(t);
    // No limit inside Beast: over its limit it closes with 1009 and nothing else, so the client never learns why.
    // read_frame() reads in pieces and answers a frame over max_frame_bytes as it answers any bad input.
    ws_.read_message_max(0);
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "pi0-serve"); }));
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) { self->on_accept(ec); });
  }

  void respond(http::status status, const std::string& body, unsigned version) {
    auto res = std::make_shared<http::response<http::string_body>>(status, version);
    res->set(http::field::server, "pi0-serve");
    res->set(http::field::content_type, "text/plain");
    res->keep_alive(false);
    res->body() = body;
    res->prepare_payload();
    http::async_write(ws_.next_layer(), *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      beast::error_code ignored;
      self->ws_.next_layer().socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  void on_accept(beast::error_code ec) {
    if (ec) return;
    accepted_ = true;
    spdlog::info("pi0-serve: connection from {} opened", remote_);
    if (stopping_) return close(websocket::close_code::going_away, "server shutting down");
    out_ = encode_json(server_.policy.metadata());
    write_binary();
  }

  void write_binary() {
    busy_ = true;
    ws_.binary(true);
    ws_.async_write(net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->busy_ = false;
      if (ec) return self->ended(ec);
      if (self->stopping_) return self->close(websocket::close_code::going_away, "server shutting down");
      self->read_frame();
    });
  }

  void read_frame() {
    in_.clear();
    read_piece();
  }

  // One frame in pieces of at most kPiece bytes, so one over the limit is refused after limit + kPiece bytes
  // (nothing more is buffered; the close handshake discards the rest as it arrives).
  void read_piece() {
    constexpr size_t kPiece = 1 << 20;
    ws_.async_read_some(in_, kPiece, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->on_frame(ec);
      const size_t max = self->server_.options.max_frame_bytes;
      if (self->in_.size() > max) {
        self->in_.clear();
        self->busy_ = true;
        return self->fail("frame larger than " + std::to_string(max) + " bytes (" + mib(max) +
                          "), expected an observation within the server's --max-frame-mb");
      }
      if (!self->ws_.is_message_done()) return self->read_piece();
      self->on_frame(ec);
    });
  }

  static std::string mib(size_t bytes) {
    std::ostringstream os;
    os << static_cast<double>(bytes) / (1 << 20) << " MiB";
    return os.str();
  }

  void on_frame(beast::error_code ec) {
    if (ec) return ended(ec);
    if (stopping_) return;
    frame_start_ = Clock::now();
    busy_ = true;
    if (!ws_.got_binary()) return fail("expected a binary msgpack frame with the observation, got a text frame");
    try {
      const auto data = in_.data();
      Fields fields = decode_frame(data.data(), data.size());
      ++server_.in_flight;
      try {
        server_.policy.submit(fields, [self = shared_from_this()](PolicyResult r, std::exception_ptr e) {
          net::post(self->ws_.get_executor(),
                    [self, r = std::move(r), e]() mutable { self->on_result(std::move(r), e); });
          --self->server_.in_flight;
        });
      } catch (...) {
        --server_.in_flight;
        throw;
      }
    } catch (const std::exception& e) {
      fail(error_text(e));
    }
  }

  void on_result(PolicyResult r, std::exception_ptr error) {
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        return fail(error_text(e));
      }
    }
    Response resp;
    resp.actions = r.actions;
    resp.policy_infer_ms = r.model_ms;
    resp.server_infer_ms = r.total_ms;
    resp.prev_total_ms = prev_total_ms_;
    resp.rtc = std::move(r.rtc);
    resp.subtask = std::move(r.subtask);
    resp.fast_decodable = std::move(r.fast_decodable);
    out_ = encode_response(resp);
    busy_ = true;
    ws_.binary(true);
    ws_.async_write(net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->busy_ = false;
      if (ec) return self->ended(ec);
      self->prev_total_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - self->frame_start_).count();
      if (self->stopping_) return self->close(websocket::close_code::going_away, "server shutting down");
      self->read_frame();
    });
  }

  // openpi: the error as a text frame, then close 1011; the client raises the text.
  void fail(const std::string& message) {
    out_ = one_line(message);
    spdlog::warn("pi0-serve: {}: {}", remote_, out_);
    busy_ = true;
    ws_.text(true);
    ws_.async_write(net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->busy_ = false;
      if (ec) return self->ended(ec);
      self->close(websocket::close_code::internal_error, kCloseReason);
    });
  }

  void close(websocket::close_code code, const char* reason) {
    if (closing_) return;
    closing_ = true;
    ws_.async_close(websocket::close_reason(code, reason),
                    [self = shared_from_this()](beast::error_code ec) { self->ended(ec); });
  }

  void ended(beast::error_code ec) {
    if (logged_end_) return;
    logged_end_ = true;
    if (ec && ec != websocket::error::closed && ec != net::error::operation_aborted && ec != net::error::eof)
      spdlog::info("pi0-serve: connection from {} ended: {}", remote_, ec.message());
    else
      spdlog::info("pi0-serve: connection from {} closed", remote_);
  }

  websocket::stream<beast::tcp_stream> ws_;
  Server::Impl& server_;
  std::string remote_;
  beast::flat_buffer http_buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  beast::flat_buffer in_;
  std::string out_;
  Clock::time_point frame_start_;
  std::optional<double> prev_total_ms_;
  bool counted_ = false, accepted_ = false, busy_ = false, stopping_ = false, closing_ = false, logged_end_ = false;
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopped || !acceptor.is_open()) return;
    if (ec) {
      // E.g. out of file descriptors: try again shortly instead of spinning on the error.
      spdlog::warn("pi0-serve: accept failed: {}", ec.message());
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this](beast::error_code e) {
        if (!e && !stopped) accept();
      });
      return;
    }
    {
      auto s = std::make_shared<Session>(std::move(socket), *this);
      {
        std::lock_guard<std::mutex> lock(mutex);
        sessions.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
        sessions.push_back(s);
      }
      s->start();
    }
    accept();
  });
}

void Server::Impl::do_stop() {
  if (stopped) return;
  stopped = true;
  spdlog::info("pi0-serve: shutting down");
  beast::error_code ec;
  acceptor.close(ec);
  signals.cancel(ec);
  retry.cancel();
  std::list<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& w : sessions)
      if (auto s = w.lock()) live.push_back(s);
  }
  for (auto& s : live) s->shutdown();
  // Clients that do not answer the close handshake are cut off after this.
  grace.expires_after(std::chrono::seconds(3));
  grace.async_wait([this](beast::error_code ec) {
    if (!ec) ioc.stop();
  });
  // Returns run() early when every connection has closed.
  auto poll = std::make_shared<std::function<void()>>();
  auto timer = std::make_shared<net::steady_timer>(strand);
  *poll = [this, weak_poll = std::weak_ptr<std::function<void()>>(poll), timer]() {
    bool any = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto& w : sessions) any = any || !w.expired();
    }
    if (!any && in_flight == 0) {
      grace.cancel();
      return;
    }
    timer->expires_after(std::chrono::milliseconds(20));
    timer->async_wait([poll = weak_poll.lock()](beast::error_code e) {
      if (!e && poll) (*poll)();
    });
  };
  (*poll)();
  polls.push_back(poll);  // kept alive until the server dies (the lambda holds only a weak reference)
}

Server::Server(Policy& policy, ServerOptions options) : impl_(std::make_unique<Impl>(policy, std::move(options))) {
  auto& o = impl_->options;
  if (o.max_clients < 1) throw UserError("--max-clients: got " + std::to_string(o.max_clients) + ", expected >= 1");
  beast::error_code ec;
  const auto address = net::ip::make_address(o.host, ec);
  if (ec) throw UserError("--host: got '" + o.host + "', expected an IP address such as 127.0.0.1 or 0.0.0.0");
  const tcp::endpoint endpoint(address, o.port);
  auto& acc = impl_->acceptor;
  acc.open(endpoint.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(endpoint, ec);
  if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw UserError("--port " + std::to_string(o.port) + ": cannot listen on " + o.host + ":" + std::to_string(o.port) +
                    " (" + ec.message() + "); expected a free port");
}

Server::~Server() {
  stop();
  // The policy may still call back for a request; its callback posts to ioc, which must outlive that.
  while (impl_->in_flight > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

uint16_t Server::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void Server::run(bool handle_signals) {
  auto& im = *impl_;
  if (handle_signals) {
    im.signals.add(SIGINT);
    im.signals.add(SIGTERM);
    im.signals.async_wait([&im](beast::error_code ec, int sig) {
      if (ec) return;
      spdlog::info("pi0-serve: signal {} received", sig);
      im.do_stop();
    });
    // A signal that came before these handlers took over (the app's start-up handlers set the interrupt flag).
    if (interrupt_requested()) {
      spdlog::info("pi0-serve: stop requested during start-up");
      net::post(im.strand, [&im] { im.do_stop(); });
    }
  }
  im.accept();
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < std::max<int64_t>(1, im.options.io_threads); ++i) threads.emplace_back([&im] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : threads) t.join();
}

void Server::stop() {
  net::post(impl_->strand, [im = impl_.get()] { im->do_stop(); });
}

}  // namespace pi0::serve
