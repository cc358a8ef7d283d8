#pragma once
// Byte relays between the sandbox's tunnel and the upstream socket. TCP payload never enters
// userspace: splice(2) moves it socket → pipe → socket (the issue asks for splice; it is also
// what keeps throughput near a direct connection). Works for any pair of Asio stream sockets
// (TCP or Unix); each direction ends with shutdown(SHUT_WR) of its destination on EOF, so
// half-close is carried through.
//
// One splice loop (relay_detail::Direction) and one idle watchdog serve every relay:
// spliceBothWays() for external TCP and ingress, spliceBackWith() for the mesh route, whose
// requests are rewritten in userspace on their way while its responses are spliced.
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
#include <asio/co_spawn.hpp>
#include <asio/redirect_error.hpp>
#include <asio/socket_base.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
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

/// How a relay ended.
enum class RelayEnd {
  kEnded,       ///< both directions reached EOF, or one failed or was closed (then both are)
  kIdle,        ///< no byte either way for TcpTimeouts::idle: both sockets closed
  kHalfClosed,  ///< a direction had ended and nothing moved for half_closed: both closed
};

/// The sam_box_limit_hits_total label of the limit that ended a relay, or nullptr.
inline const char* limitHit(RelayEnd end) {
  switch (end) {
    case RelayEnd::kIdle:
      return kLimitTcpIdleTimeout;
    case RelayEnd::kHalfClosed:
      return kLimitHalfClosedTimeout;
    case RelayEnd::kEnded:
      break;
  }
  return nullptr;
}

namespace relay_detail {

/// What the directions of one relay share: the ops in flight, how it ends, and the timer its
/// coroutine sleeps on (cancelled to wake it once the relay is over).
struct Shared {
  /// `a` and `b` are the relay's two sockets: close() closes both.
  template <typename A, typename B>
  Shared(asio::steady_timer& t, A& a, B& b)
      : timer(t), close_both([&a, &b] {
          asio::error_code ignored;
          a.close(ignored);
          b.close(ignored);
        }) {}
  asio::steady_timer& timer;
  std::function<void()> close_both;
  int pending = 0;      ///< ops in flight; their handlers refer to this frame
  int ended = 0;        ///< directions that reached EOF
  bool closed = false;  ///< a direction failed or the flow idled: both sockets are closed
  [[nodiscard]] bool over() const { return pending == 0 && (closed || ended == 2); }
  void wakeIfOver() const {
    if (over()) timer.cancel();
  }
  /// Closes both sockets (once), which ends every wait still in flight with an error.
  void close() {
    if (closed) return;
    closed = true;
    close_both();
  }
};

/// One spliced direction of a relay, run by completion handlers instead of a coroutine of its
/// own, so that a flow costs no coroutine frames, no parallel group and no cancellation slots
/// per direction. The only splice loop of sam-box.
template <typename Src, typename Dst>
class Direction {
 public:
  Direction(Src& src, Dst& dst, uint64_t& moved, PipePool& pool, Shared& shared)
      : src_(src), dst_(dst), moved_(moved), pool_(pool), shared_(shared) {}
  Direction(const Direction&) = delete;
  Direction& operator=(const Direction&) = delete;

  void start() {
    // Sockets the server already made non-blocking (all of them, normally) cost no ioctl here.
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
        // EOF: carried through as a half-close.
        pool_.release(std::move(pipe_));
        asio::error_code ignored;
        dst_.shutdown(asio::socket_base::shutdown_send, ignored);
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

  /// A socket error (or a wait ended by a close): both sockets are closed, which ends the
  /// other direction's wait too. A pipe that may hold bytes is dropped, not reused.
  void fail() {
    shared_.close();
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
  PipePool::Pipe pipe_;
  size_t in_pipe_ = 0;  ///< bytes spliced into pipe_ and not yet out
  size_t last_in_ = 0;  ///< bytes the last splice into pipe_ moved
};

/// The relay's own coroutine: sleeps on `shared.timer` until the relay is over, and closes
/// the flow when it idles (see spliceBothWays()). One timer is both the idle watchdog and the
/// relay's end: a direction cancels it once both have ended, or once a failure has closed
/// both sockets and no wait is left in flight.
inline asio::awaitable<RelayEnd> watch(Shared& shared, const uint64_t& a_to_b,
                                       const uint64_t& b_to_a, TcpTimeouts timeouts) {
  RelayEnd end = RelayEnd::kEnded;
  uint64_t seen = a_to_b + b_to_a;
  auto last_activity = std::chrono::steady_clock::now();
  while (!shared.over()) {
    shared.timer.expires_after(timeouts.check_interval);
    asio::error_code ec;
    co_await shared.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (shared.over() || shared.closed) continue;  // over, or the closed waits still unwinding
    const auto now = std::chrono::steady_clock::now();
    if (a_to_b + b_to_a != seen) {
      seen = a_to_b + b_to_a;
      last_activity = now;
      continue;
    }
    const bool half_closed = shared.ended > 0;
    if (now - last_activity >= (half_closed ? timeouts.half_closed : timeouts.idle)) {
      end = half_closed ? RelayEnd::kHalfClosed : RelayEnd::kIdle;
      shared.close();  // ends every wait; their handlers run before the loop ends
    }
  }
  co_return end;
}

}  // namespace relay_detail

/// Relays both directions until both have reached EOF, until either fails, or until the flow
/// idles: no byte either way for `timeouts.idle`, or, once one direction has ended, none for
/// `timeouts.half_closed` (a peer that went away without a reset, or an upstream that never
/// answers an agent that has said all it will, must not hold a flow for the full idle time).
/// On failure or idling both sockets are closed and the error is swallowed: a reset is an
/// ordinary end of a flow. So is a close from outside (a stopping boundary closes the sockets
/// of every open flow). `a_to_b` and `b_to_a` count bytes delivered.
template <typename A, typename B>
asio::awaitable<RelayEnd> spliceBothWays(A& a, B& b, uint64_t& a_to_b, uint64_t& b_to_a,
                                         PipePool& pool, TcpTimeouts timeouts = {}) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  relay_detail::Shared shared(timer, a, b);
  relay_detail::Direction<A, B> forward(a, b, a_to_b, pool, shared);
  relay_detail::Direction<B, A> backward(b, a, b_to_a, pool, shared);
  forward.start();
  backward.start();
  co_return co_await relay_detail::watch(shared, a_to_b, b_to_a, timeouts);
}

/// spliceBothWays() where a→b is moved by `forward`, a coroutine of the caller's, instead of
/// splice(2) (the mesh route rewrites each request on its way). `forward` adds to `a_to_b`
/// what `b` took, shuts down writing on `b` at `a`'s EOF and returns, or throws on a failure
/// (then both sockets are closed); it may wait only on `a` and `b`, so that closing them ends
/// it. b→a is spliced. Same watchdog, timeouts and ending as spliceBothWays().
template <typename A, typename B>
asio::awaitable<RelayEnd> spliceBackWith(asio::awaitable<void> forward, A& a, B& b,
                                         uint64_t& a_to_b, uint64_t& b_to_a, PipePool& pool,
                                         TcpTimeouts timeouts = {}) {
  const auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  relay_detail::Shared shared(timer, a, b);
  relay_detail::Direction<B, A> backward(b, a, b_to_a, pool, shared);
  // `forward` counts as one op in flight until it returns: the relay's frame outlives it.
  ++shared.pending;
  asio::co_spawn(executor, std::move(forward), [&shared](const std::exception_ptr& failure) {
    --shared.pending;
    if (failure) {
      shared.close();
    } else {
      ++shared.ended;
    }
    shared.wakeIfOver();
  });
  backward.start();
  co_return co_await relay_detail::watch(shared, a_to_b, b_to_a, timeouts);
}

}  // namespace sambox
