// bench/load_common.h: what the two benchmark load generators share — sam-box-bench-load
// (bench/load.cc, driven by bench/sam_box_bench.py) and nano-init-bench-load
// (bench/nano-init/nano_load.cc, driven by bench/nano_init_bench.py). They differ only in how
// the client reaches the upstream (a CONNECT proxy on loopback vs. a name resolved in the
// namespace it runs in); the upstream, the wire protocol and the timed client loops are here,
// so both tools measure the same thing the same way.
//
// Wire protocol between client and upstream (after the tunnel, if any, is up):
//   'e'                      upstream answers 'e', then echoes every byte until EOF
//   't' u64be up u64be down  client sends `up` bytes; upstream sends `down` bytes and then,
//                            once it has received all `up` and sent all `down`, the 8-byte
//                            big-endian count of bytes it received
//
// Nothing here links the project: the tools measure sam-box and nano-init from outside.
// Errors are thrown (std::system_error for a failing syscall, with its name; otherwise
// std::runtime_error / std::invalid_argument with the reason); each tool's main() turns them
// into a line on stderr (or a JSON error line) and exit status 1.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace benchload {

using Clock = std::chrono::steady_clock;

inline constexpr size_t kIoChunkBytes = 1 << 20;  // per read/write call on bulk data
inline constexpr int kSocketTimeoutSeconds = 30;  // every blocking client call
inline constexpr int kHoldMaxSeconds = 300;       // `hold` gives up waiting for stdin

/// Throws std::system_error carrying the current errno; `what` names the failing call.
[[noreturn]] void sysFail(const std::string& what);

/// Owns one file descriptor; closes it on destruction or reset().
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  /// The descriptor, or -1 when empty.
  [[nodiscard]] int get() const { return fd_; }
  /// Closes the owned descriptor (if any) and takes `fd` (-1: own nothing).
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// A role's arguments: `--key value` pairs.
class Args {
 public:
  /// Reads argv[first..] as `--key value` pairs (a later key overrides an earlier one).
  /// Throws std::invalid_argument "expected --key value, got X" for a word that does not start
  /// with "--" or a key without a value.
  Args(const std::vector<std::string>& argv, size_t first);
  /// The value of --key; `def` when absent. An empty `def` means required: throws
  /// std::invalid_argument "--key is required".
  [[nodiscard]] std::string str(const std::string& key, const std::string& def = "") const;
  /// The value of --key as an unsigned decimal; `def` when absent. A value that is not a
  /// number throws std::invalid_argument / std::out_of_range from std::stoull.
  [[nodiscard]] uint64_t num(const std::string& key, uint64_t def) const;

 private:
  std::map<std::string, std::string> values_;
};

/// Writes `v` as 8 big-endian bytes to out[0..8).
void putU64(unsigned char* out, uint64_t v);

/// Reads 8 big-endian bytes from in[0..8).
uint64_t getU64(const unsigned char* in);

/// kIoChunkBytes of a fixed, non-zero pattern: what both sides send as bulk data.
const std::vector<char>& sourceBytes();

/// Sets SO_RCVTIMEO and SO_SNDTIMEO of socket `fd` to kSocketTimeoutSeconds, so a stuck
/// peer turns into an error instead of a hang.
void setTimeouts(int fd);

/// Sends all n bytes of `data` on blocking socket `fd` (no SIGPIPE). Throws on an error or
/// a timeout.
void sendAll(int fd, const void* data, size_t n);

/// Reads exactly n bytes into `data`; EOF, an error or a timeout throws.
void recvExact(int fd, void* data, size_t n);

/// Sends 'e' and reads the echoed 'e' back: proves the path carries data end to end, and
/// leaves the upstream in echo mode. Throws when the answer is missing or wrong.
void echoOnce(int fd);

/// CPU time (user + system) of this process, all threads, in seconds.
double cpuSeconds();

/// Wall-clock seconds since t0.
double secondsSince(Clock::time_point t0);

/// `warmup` + `count` sequential calls of open_echoed (each opens a stream and echoes one
/// byte, see echoOnce), each timed and closed before the next. Returns the `count` times
/// after the warm-up, in microseconds. open_echoed's exceptions pass through.
std::vector<double> latencySamplesUs(uint64_t warmup, uint64_t count,
                                     const std::function<Fd()>& open_echoed);

/// Prints the samples to stdout as a JSON array, two decimals each: "[1.00,2.50]".
void printSamplesUs(const std::vector<double>& us);

/// The `throughput` role on connected stream `fd` (the upstream, or a tunnel to it): sends the
/// 't' header, `up` bytes from a second thread while receiving `down` bytes and the 8-byte
/// ack, then prints {"seconds":S,"up_bytes":N,"down_bytes":M,"cpu_s":C} on stdout. Throws on
/// a send or receive error, or when the upstream's ack is not `up`. Returns 0.
int runThroughputOn(int fd, uint64_t up, uint64_t down);

/// The `hold` role: opens `count` streams with open_echoed, prints {"open":N,"seconds":S},
/// keeps them until stdin sends '\n' or closes, a stop is requested, or kHoldMaxSeconds pass,
/// then closes them and prints {"closed":N}. Returns 0.
int runHoldWith(uint64_t count, const std::function<Fd()>& open_echoed);

/// The `serve` role: the upstream of the wire protocol on `addr` (port 0: any), one thread,
/// epoll. Prints {"port":P} on stdout once listening, then serves until a stop is requested.
/// Throws when it cannot bind or listen. Returns 0.
int runServeOn(const sockaddr_in& addr);

/// True once SIGTERM or SIGINT arrived (see setUpProcess).
bool stopRequested();

/// What both tools do first: ignore SIGPIPE (a closed peer is an error return, not a death),
/// make SIGTERM/SIGINT set stopRequested() (so `serve` and `hold` end cleanly), and raise
/// RLIMIT_NOFILE to its hard limit (`hold` opens thousands of sockets).
void setUpProcess();

}  // namespace benchload
