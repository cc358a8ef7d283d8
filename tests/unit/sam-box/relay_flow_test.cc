// spliceBothWays() and spliceBackWith() end to end over socket pairs: bytes and half-closes
// carried both ways, large transfers (full pipes and full destinations), a failure closing
// both sides, the idle and half-closed timeouts (shortened), and a close from outside (what
// a stopping boundary does).

#include "sam-box/relay.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/post.hpp>
#include <asio/write.hpp>

#include <array>
#include <cctype>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>

namespace sambox {
namespace {

using Socket = asio::local::stream_protocol::socket;

/// One end kept by the test (a blocking fd), the other handed to the relay.
struct Pair {
  int peer = -1;
  Socket relay_end;
  explicit Pair(asio::io_context& io) : relay_end(io) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    peer = fds[0];
    relay_end.assign(asio::local::stream_protocol(), fds[1]);
    timeval tv{10, 0};  // a stuck relay fails the test instead of hanging it
    ::setsockopt(peer, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(peer, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  ~Pair() {
    if (peer >= 0) ::close(peer);
  }
};

bool writeAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

/// Everything until EOF (or an error or timeout: then what came so far).
std::string readAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

/// Timeouts a test can wait out: well past any scheduling hiccup, far below the defaults.
TcpTimeouts shortTimeouts() {
  TcpTimeouts t;
  t.idle = std::chrono::milliseconds(1500);
  t.half_closed = std::chrono::milliseconds(300);
  t.check_interval = std::chrono::milliseconds(20);
  return t;
}

struct Relay {
  asio::io_context io;
  PipePool pool{64 * 1024, 4};
  Pair client{io};
  Pair server{io};
  uint64_t up = 0;
  uint64_t down = 0;
  bool done = false;
  RelayEnd end = RelayEnd::kIdle;
  std::chrono::steady_clock::duration took{};

  void start(TcpTimeouts timeouts = {}) {
    spawn(spliceBothWays(client.relay_end, server.relay_end, up, down, pool, timeouts));
  }

  /// Runs `relay` on io, recording how and when it ended.
  void spawn(asio::awaitable<RelayEnd> relay) {
    asio::co_spawn(
        io,
        [this, relay = std::move(relay)]() mutable -> asio::awaitable<void> {
          const auto started = std::chrono::steady_clock::now();
          end = co_await std::move(relay);
          took = std::chrono::steady_clock::now() - started;
          done = true;
        },
        asio::detached);
  }
};

/// The agent sends `request` and half-closes; the upstream never reads nor answers. Runs the
/// relay to its end and returns what the agent received (EOF once the relay gives up).
std::string halfCloseToASilentUpstream(Relay& r, const std::string& request) {
  std::string got;
  std::thread agent([&] {
    EXPECT_TRUE(writeAll(r.client.peer, request));
    ::shutdown(r.client.peer, SHUT_WR);
    got = readAll(r.client.peer);
  });
  r.io.run();
  agent.join();
  return got;
}

/// What a stopping boundary does to an open flow: once the server has received 3 bytes of
/// "abc", both of the relay's sockets are closed from outside. Runs the relay to its end
/// (io.run() returns only once every part of it has) and returns what the server received.
std::string closeFromOutsideAfterThreeBytes(Relay& r) {
  std::string received;
  std::thread peers([&] {
    EXPECT_TRUE(writeAll(r.client.peer, "abc"));
    char buf[3];
    size_t n = 0;
    while (n < sizeof buf) {
      const ssize_t got = ::recv(r.server.peer, buf + n, sizeof buf - n, 0);
      if (got <= 0) break;
      n += static_cast<size_t>(got);
    }
    received.assign(buf, n);
    asio::post(r.io, [&] {
      asio::error_code ignored;
      r.client.relay_end.close(ignored);
      r.server.relay_end.close(ignored);
    });
    readAll(r.client.peer);
  });
  r.io.run();
  peers.join();
  return received;
}

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 4096) % 26);
  return s;
}

TEST(RelayFlowTest, CarriesBytesAndHalfClosesBothWays) {
  Relay r;
  r.start();
  std::thread peers([&] {
    EXPECT_TRUE(writeAll(r.client.peer, "hello"));
    ::shutdown(r.client.peer, SHUT_WR);
    EXPECT_EQ(readAll(r.server.peer), "hello");  // then EOF: the half-close arrived
    EXPECT_TRUE(writeAll(r.server.peer, "world!"));
    ::shutdown(r.server.peer, SHUT_WR);
    EXPECT_EQ(readAll(r.client.peer), "world!");
  });
  r.io.run();
  peers.join();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_EQ(r.up, 5U);
  EXPECT_EQ(r.down, 6U);
  EXPECT_EQ(r.pool.idle(), 1U);  // the pipe came back empty, once, and was reused
}

TEST(RelayFlowTest, LargeTransfersBothWaysAtOnce) {
  Relay r;
  r.start();
  const std::string up = pattern(24 << 20);
  const std::string down = pattern(17 << 20).substr(3);
  std::string got_up;
  std::string got_down;
  std::thread w1([&] {
    EXPECT_TRUE(writeAll(r.client.peer, up));
    ::shutdown(r.client.peer, SHUT_WR);
  });
  std::thread w2([&] {
    EXPECT_TRUE(writeAll(r.server.peer, down));
    ::shutdown(r.server.peer, SHUT_WR);
  });
  std::thread r1([&] { got_up = readAll(r.server.peer); });
  std::thread r2([&] { got_down = readAll(r.client.peer); });
  r.io.run();
  for (auto* t : {&w1, &w2, &r1, &r2}) t->join();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_TRUE(got_up == up) << got_up.size() << " of " << up.size();
  EXPECT_TRUE(got_down == down) << got_down.size() << " of " << down.size();
  EXPECT_EQ(r.up, up.size());
  EXPECT_EQ(r.down, down.size());
}

TEST(RelayFlowTest, SlowReaderIsWaitedFor) {
  Relay r;
  r.start();
  const std::string up = pattern(4 << 20);
  std::string got;
  std::thread writer([&] {
    EXPECT_TRUE(writeAll(r.client.peer, up));
    ::shutdown(r.client.peer, SHUT_WR);
  });
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the relay fills the socket
    got = readAll(r.server.peer);
    ::shutdown(r.server.peer, SHUT_WR);
  });
  r.io.run();
  writer.join();
  reader.join();
  EXPECT_TRUE(r.done);
  EXPECT_TRUE(got == up) << got.size();
  EXPECT_EQ(r.up, up.size());
}

TEST(RelayFlowTest, AFailureClosesBothSides) {
  std::signal(SIGPIPE, SIG_IGN);  // as sam-box's main() does: a peer gone is an error, not a kill
  Relay r;
  r.start();
  std::thread peers([&] {
    // The server goes away; the relay's next write to it fails (EPIPE).
    ::close(r.server.peer);
    r.server.peer = -1;
    const std::string chunk = pattern(1 << 20);
    for (int i = 0; i < 8 && writeAll(r.client.peer, chunk); ++i) {
    }
    // Both relay ends are closed: the client sees its stream end.
    readAll(r.client.peer);
  });
  r.io.run();
  peers.join();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_FALSE(r.client.relay_end.is_open());
  EXPECT_FALSE(r.server.relay_end.is_open());
}

TEST(RelayFlowTest, HalfClosedFlowWhoseUpstreamNeverAnswersIsClosed) {
  // The agent says all it will and half-closes; the upstream never reads nor closes. The flow
  // is closed once the half-closed timeout passes, not after the idle timeout.
  Relay r;
  r.start(shortTimeouts());
  const std::string got = halfCloseToASilentUpstream(r, "request");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kHalfClosed);
  EXPECT_EQ(got, "");
  EXPECT_EQ(r.up, 7U);  // delivered into the upstream's socket, never read
  EXPECT_GE(r.took, shortTimeouts().half_closed);
  EXPECT_LT(r.took, shortTimeouts().idle);
  EXPECT_FALSE(r.server.relay_end.is_open());
  EXPECT_EQ(limitHit(r.end), std::string(kLimitHalfClosedTimeout));
}

TEST(RelayFlowTest, BytesAfterAHalfCloseKeepTheFlowOpen) {
  // The half-closed timeout counts silence, not age: an upstream that keeps answering after
  // the agent's half-close is relayed to its end.
  Relay r;
  r.start(shortTimeouts());
  std::string got;
  std::thread peers([&] {
    EXPECT_TRUE(writeAll(r.client.peer, "q"));
    ::shutdown(r.client.peer, SHUT_WR);
    for (int i = 0; i < 8; ++i) {  // 8 x 100 ms: over twice the half-closed timeout
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_TRUE(writeAll(r.server.peer, "x"));
    }
    ::shutdown(r.server.peer, SHUT_WR);
    got = readAll(r.client.peer);
  });
  r.io.run();
  peers.join();
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_EQ(got, "xxxxxxxx");
  EXPECT_EQ(r.down, 8U);
}

TEST(RelayFlowTest, SilentFlowIsClosedAfterTheIdleTimeout) {
  Relay r;
  r.start(shortTimeouts());
  r.io.run();  // nobody sends anything
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kIdle);
  EXPECT_GE(r.took, shortTimeouts().idle);
  EXPECT_EQ(limitHit(r.end), std::string(kLimitTcpIdleTimeout));
  EXPECT_FALSE(r.client.relay_end.is_open());
}

TEST(RelayFlowTest, ACloseFromOutsideEndsTheRelayAndKeepsItsCount) {
  // What a stopping boundary does to an open flow: close its sockets. The relay ends at
  // once (default timeouts: nothing else could end it), with the bytes it moved.
  Relay r;
  r.start();
  EXPECT_EQ(closeFromOutsideAfterThreeBytes(r), "abc");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_EQ(r.up, 3U);
  EXPECT_LT(r.took, std::chrono::seconds(5));
}

// spliceBackWith(): client → server by a coroutine of the test's (upper-casing, as the mesh
// route rewrites), server → client spliced.

/// The client → server direction of a BackRelay: upper-cases what it forwards, fails on '!'.
asio::awaitable<void> upperCase(Relay& r) {
  std::array<char, 4096> buf{};
  for (;;) {
    asio::error_code ec;
    const size_t n = co_await r.client.relay_end.async_read_some(
        asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::eof) {
      r.server.relay_end.shutdown(asio::socket_base::shutdown_send, ec);
      co_return;
    }
    if (ec) throw asio::system_error(ec);
    for (size_t i = 0; i < n; ++i) {
      if (buf[i] == '!') throw asio::system_error(asio::error::invalid_argument);
      buf[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(buf[i])));
    }
    co_await asio::async_write(r.server.relay_end, asio::buffer(buf.data(), n),
                               asio::use_awaitable);
    r.up += n;
  }
}

struct BackRelay : Relay {
  void startBackWith(TcpTimeouts timeouts = {}) {
    spawn(spliceBackWith(upperCase(*this), client.relay_end, server.relay_end, up, down, pool,
                         timeouts));
  }
};

TEST(RelayFlowTest, BackWithCarriesBothWaysAndHalfCloses) {
  BackRelay r;
  r.startBackWith();
  const std::string down = pattern(3 << 20);
  std::string got_down;
  std::thread peers([&] {
    EXPECT_TRUE(writeAll(r.client.peer, "hello"));
    ::shutdown(r.client.peer, SHUT_WR);
    EXPECT_EQ(readAll(r.server.peer), "HELLO");  // then EOF: the half-close arrived
    std::thread reader([&] { got_down = readAll(r.client.peer); });
    EXPECT_TRUE(writeAll(r.server.peer, down));
    ::shutdown(r.server.peer, SHUT_WR);
    reader.join();
  });
  r.io.run();
  peers.join();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_TRUE(got_down == down) << got_down.size();
  EXPECT_EQ(r.up, 5U);
  EXPECT_EQ(r.down, down.size());
}

TEST(RelayFlowTest, BackWithAFailingCoroutineClosesBothSides) {
  BackRelay r;
  r.startBackWith();
  std::thread peers([&] {
    EXPECT_TRUE(writeAll(r.client.peer, "no!"));
    EXPECT_EQ(readAll(r.server.peer), "");  // closed, nothing forwarded
    readAll(r.client.peer);
  });
  r.io.run();
  peers.join();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_FALSE(r.client.relay_end.is_open());
  EXPECT_FALSE(r.server.relay_end.is_open());
}

TEST(RelayFlowTest, BackWithHalfClosedWhileTheServerNeverAnswersIsClosed) {
  // The mesh route's case: the agent sends its request and half-closes; the node never reads
  // it nor answers.
  BackRelay r;
  r.startBackWith(shortTimeouts());
  const std::string got = halfCloseToASilentUpstream(r, "get /");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kHalfClosed);
  EXPECT_EQ(got, "");
  EXPECT_EQ(r.up, 5U);
  EXPECT_GE(r.took, shortTimeouts().half_closed);
  EXPECT_LT(r.took, shortTimeouts().idle);
}

TEST(RelayFlowTest, BackWithACloseFromOutsideEndsTheCoroutineToo) {
  BackRelay r;
  r.startBackWith();
  // Returns only once the coroutine, too, has ended.
  EXPECT_EQ(closeFromOutsideAfterThreeBytes(r), "ABC");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.end, RelayEnd::kEnded);
  EXPECT_EQ(r.up, 3U);
}

}  // namespace
}  // namespace sambox
