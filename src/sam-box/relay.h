#pragma once
// Byte relays between the sandbox's tunnel and the upstream socket. TCP payload never enters
// userspace: splice(2) moves it socket → pipe → socket (the issue asks for splice; it is also
// what keeps throughput near a direct connection). Works for any pair of Asio stream sockets
// (TCP or Unix); each direction ends with shutdown(SHUT_WR) of its destination on EOF, so
// half-close is carried through.
//
// Pipes come from a PipePool: a direction holds one only while bytes are in flight and gives
// it back, empty, whenever it waits for its source. So an idle flow holds two sockets and no
// pipe, a flow's set-up costs no pipe2(2), and the number of (large) pipes is bounded by the
// flows moving data at that instant rather than by the flows open.

#include "common/unique_fd.h"
#include "sam-box/limits.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/redirect_error.hpp>
#include <asio/socket_base.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <system_error>
#include <vector>

namespace sambox {

/// Empty pipes for the relays, reused across flows. Single-threaded (the io_context thread).
class PipePool {
 public:
  /// A pipe's two ends; empty when both are -1.
  struct Pipe {
    common::UniqueFd read_end;
    common::UniqueFd write_end;
    [[nodiscard]] bool valid() const { return read_end.valid(); }
  };

  /// `pipe_bytes`: the size asked for with F_SETPIPE_SZ (best effort: past the user's
  /// fs.pipe-user-pages-soft budget the kernel's default stays). `max_idle`: most empty pipes
  /// kept for reuse; more are closed.
  PipePool(size_t pipe_bytes, size_t max_idle) : pipe_bytes_(pipe_bytes), max_idle_(max_idle) {}

  /// An empty pipe, reused or new. Throws std::system_error (pipe2(2)).
  Pipe acquire();
  /// Takes back a pipe. The caller guarantees it is empty: every byte spliced into it was
  /// spliced out. A pipe that may hold bytes must be destroyed instead, never released.
  void release(Pipe pipe);
  /// Bytes moved per splice(2) call.
  [[nodiscard]] size_t chunkBytes() const { return pipe_bytes_; }
  [[nodiscard]] size_t idle() const { return idle_.size(); }

 private:
  size_t pipe_bytes_;
  size_t max_idle_;
  std::vector<Pipe> idle_;
};

/// Moves bytes from `src` to `dst` until EOF on `src`, then shuts down writing on `dst`.
/// `moved` is incremented by each byte delivered to `dst` as it goes (bytes).
/// Throws asio::system_error on a socket error (e.g. ECONNRESET); the caller closes both.
template <typename Src, typename Dst>
asio::awaitable<void> spliceOneWay(Src& src, Dst& dst, uint64_t& moved, PipePool& pool) {
  // Sockets the server already made non-blocking (all of them, normally) cost no ioctl here.
  if (!src.non_blocking() && !src.native_non_blocking()) src.native_non_blocking(true);
  if (!dst.non_blocking() && !dst.native_non_blocking()) dst.native_non_blocking(true);
  PipePool::Pipe pipe;
  for (;;) {
    // Asio re-arms the descriptor (EPOLL_CTL_MOD) for every wait, so the wait completes at
    // once if bytes are already there: no splice needs to fail with EAGAIN before it.
    pool.release(std::move(pipe));  // empty: every byte spliced into it went out
    co_await src.async_wait(asio::socket_base::wait_read, asio::use_awaitable);
    pipe = pool.acquire();
    for (;;) {
      const ssize_t in = ::splice(src.native_handle(), nullptr, pipe.write_end.get(), nullptr,
                                  pool.chunkBytes(), SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (in == 0) {
        pool.release(std::move(pipe));
        asio::error_code ignored;
        dst.shutdown(asio::socket_base::shutdown_send, ignored);
        co_return;
      }
      if (in < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        throw asio::system_error(asio::error_code(errno, asio::system_category()), "splice in");
      }
      size_t pending = static_cast<size_t>(in);
      while (pending > 0) {
        const ssize_t out = ::splice(pipe.read_end.get(), nullptr, dst.native_handle(), nullptr,
                                     pending, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (out < 0) {
          if (errno == EAGAIN || errno == EINTR) {
            co_await dst.async_wait(asio::socket_base::wait_write, asio::use_awaitable);
            continue;
          }
          throw asio::system_error(asio::error_code(errno, asio::system_category()), "splice out");
        }
        pending -= static_cast<size_t>(out);
        moved += static_cast<uint64_t>(out);
      }
      // A step short of the pipe's size emptied the source (or the pipe's slots ran out; the
      // wait then completes at once): wait rather than try again.
      if (static_cast<size_t>(in) < pool.chunkBytes()) break;
    }
  }
}

namespace relay_detail {

/// What the two directions of one spliceBothWays() share: the ops in flight, how it ends, and
/// the timer its coroutine sleeps on (cancelled to wake it once the relay is over).
struct Shared {
  asio::steady_timer* timer = nullptr;
  int pending = 0;      ///< socket waits in flight; their handlers refer to this frame
  int ended = 0;        ///< directions that reached EOF
  bool closed = false;  ///< a direction failed or the flow idled: both sockets are closed
  [[nodiscard]] bool over() const { return pending == 0 && (closed || ended == 2); }
  void wakeIfOver() const {
    if (over()) timer->cancel();
  }
};

/// One direction of spliceBothWays(): spliceOneWay()'s loop, run by completion handlers
/// instead of a coroutine of its own, so that a flow costs no coroutine frames, no parallel
/// group and no cancellation slots per direction.
template <typename Src, typename Dst>
class Direction {
 public:
  Direction(Src& src, Dst& dst, uint64_t& moved, PipePool& pool, Shared& shared,
            std::function<void()> close_both)
      : src_(src),
        dst_(dst),
        moved_(moved),
        pool_(pool),
        shared_(shared),
        close_both_(std::move(close_both)) {}
  Direction(const Direction&) = delete;
  Direction& operator=(const Direction&) = delete;

  [[nodiscard]] bool ended() const { return ended_; }

  void start() {
    try {
      if (!src_.non_blocking() && !src_.native_non_blocking()) src_.native_non_blocking(true);
      if (!dst_.non_blocking() && !dst_.native_non_blocking()) dst_.native_non_blocking(true);
    } catch (const std::exception&) {
      fail();
      return;
    }
    waitReadable();
  }

 private:
  // Asio re-arms the descriptor (EPOLL_CTL_MOD) for every wait, so the wait completes at
  // once if bytes are already there: no splice needs to fail with EAGAIN before it.
  void waitReadable() {
    pool_.release(std::move(pipe_));  // empty: every byte spliced into it went out
    ++shared_.pending;
    src_.async_wait(asio::socket_base::wait_read, [this](const asio::error_code& ec) {
      --shared_.pending;
      if (ec || shared_.closed) return fail();
      try {
        pipe_ = pool_.acquire();
      } catch (const std::exception&) {
        return fail();
      }
      pump();
    });
  }

  void waitWritable() {
    ++shared_.pending;
    dst_.async_wait(asio::socket_base::wait_write, [this](const asio::error_code& ec) {
      --shared_.pending;
      if (ec || shared_.closed) return fail();
      if (!drain()) return;
      afterStep();
    });
  }

  /// Moves bytes until the source is empty (then waits for it), EOF, or the destination is
  /// full (then waits for that).
  void pump() {
    for (;;) {
      const ssize_t in = ::splice(src_.native_handle(), nullptr, pipe_.write_end.get(), nullptr,
                                  pool_.chunkBytes(), SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (in == 0) {
        pool_.release(std::move(pipe_));
        asio::error_code ignored;
        dst_.shutdown(asio::socket_base::shutdown_send, ignored);
        ended_ = true;
        ++shared_.ended;
        shared_.wakeIfOver();
        return;
      }
      if (in < 0) {
        if (errno == EAGAIN || errno == EINTR) return waitReadable();
        return fail();
      }
      last_in_ = static_cast<size_t>(in);
      in_pipe_ = last_in_;
      if (!drain()) return;
      if (!again()) return waitReadable();
    }
  }

  /// Whether to splice again at once rather than wait after a step of last_in_ bytes.
  bool again() const {
    // A full step: more is probably there. A shorter one emptied the source: wait rather than
    // fail a splice with EAGAIN. (Splicing again after any large step kept a fast uploader in
    // this loop for hundreds of ms, while every other flow, accept and /metrics waited.)
    return last_in_ >= pool_.chunkBytes();
  }

  /// Splices the pipe's bytes out. False if it had to wait for the destination (the wait is
  /// armed) or failed.
  bool drain() {
    while (in_pipe_ > 0) {
      const ssize_t out = ::splice(pipe_.read_end.get(), nullptr, dst_.native_handle(), nullptr,
                                   in_pipe_, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (out < 0) {
        if (errno == EAGAIN || errno == EINTR) {
          waitWritable();
        } else {
          fail();
        }
        return false;
      }
      in_pipe_ -= static_cast<size_t>(out);
      moved_ += static_cast<uint64_t>(out);
    }
    return true;
  }

  void afterStep() {
    if (!again()) return waitReadable();
    pump();
  }

  /// A socket error (or a wait ended by the close below): both sockets are closed, which
  /// ends the other direction's wait too. A pipe that may hold bytes is dropped, not reused.
  void fail() {
    if (!shared_.closed) {
      shared_.closed = true;
      close_both_();
    }
    if (in_pipe_ > 0) pipe_ = PipePool::Pipe{};
    in_pipe_ = 0;
    pool_.release(std::move(pipe_));
    shared_.wakeIfOver();
  }

  Src& src_;
  Dst& dst_;
  uint64_t& moved_;
  PipePool& pool_;
  Shared& shared_;
  std::function<void()> close_both_;
  PipePool::Pipe pipe_;
  size_t in_pipe_ = 0;  ///< bytes spliced into pipe_ and not yet out
  size_t last_in_ = 0;  ///< bytes the last splice into pipe_ moved
  bool ended_ = false;
};

}  // namespace relay_detail

/// Relays both directions until both have reached EOF, until either fails, or until the flow
/// idles: no byte either way for kTcpIdleTimeout, or, once one direction has ended, none for
/// kHalfClosedTimeout (a peer that went away without a reset must not hold a flow forever).
/// On failure or idling both sockets are closed and the error is swallowed: a reset is an
/// ordinary end of a flow. `a_to_b` and `b_to_a` count bytes delivered. Returns true if the
/// flow was ended for idling.
template <typename A, typename B>
asio::awaitable<bool> spliceBothWays(A& a, B& b, uint64_t& a_to_b, uint64_t& b_to_a,
                                     PipePool& pool) {
  // One timer is both the idle watchdog and the relay's end: a direction cancels it once
  // both have ended, or once a failure has closed both sockets and no wait is left in flight.
  asio::steady_timer timer(co_await asio::this_coro::executor);
  relay_detail::Shared shared;
  shared.timer = &timer;
  auto close_both = [&a, &b] {
    asio::error_code ignored;
    a.close(ignored);
    b.close(ignored);
  };
  relay_detail::Direction<A, B> forward(a, b, a_to_b, pool, shared, close_both);
  relay_detail::Direction<B, A> backward(b, a, b_to_a, pool, shared, close_both);
  forward.start();
  backward.start();
  bool idled = false;
  uint64_t seen = a_to_b + b_to_a;
  auto last_activity = std::chrono::steady_clock::now();
  while (!shared.over()) {
    timer.expires_after(kIdleCheckInterval);
    asio::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (shared.over() || shared.closed) continue;  // over, or the closed waits still unwinding
    const auto now = std::chrono::steady_clock::now();
    if (a_to_b + b_to_a != seen) {
      seen = a_to_b + b_to_a;
      last_activity = now;
      continue;
    }
    const auto limit = (forward.ended() || backward.ended()) ? kHalfClosedTimeout : kTcpIdleTimeout;
    if (now - last_activity >= limit) {
      idled = true;
      shared.closed = true;
      close_both();  // ends both waits; their handlers run before the loop ends
    }
  }
  co_return idled;
}

}  // namespace sambox
