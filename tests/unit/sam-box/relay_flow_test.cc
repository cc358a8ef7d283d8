// spliceBothWays() end to end over socket pairs: bytes and half-closes carried both ways,
// large transfers (full pipes and full destinations), and a failure closing both sides.

#include "sam-box/relay.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>

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

struct Relay {
  asio::io_context io;
  PipePool pool{64 * 1024, 4};
  Pair client{io};
  Pair server{io};
  uint64_t up = 0;
  uint64_t down = 0;
  bool done = false;
  bool idled = true;

  void start() {
    asio::co_spawn(
        io,
        [this]() -> asio::awaitable<void> {
          idled = co_await spliceBothWays(client.relay_end, server.relay_end, up, down, pool);
          done = true;
        },
        asio::detached);
  }
};

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
  EXPECT_FALSE(r.idled);
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
  EXPECT_FALSE(r.idled);
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
  EXPECT_FALSE(r.idled);
  EXPECT_FALSE(r.client.relay_end.is_open());
  EXPECT_FALSE(r.server.relay_end.is_open());
}

}  // namespace
}  // namespace sambox
