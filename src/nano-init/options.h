#pragma once
// The command line (issue 3 "Commands"):
//   nano-init run [--create-namespaces] [--ingress-socket PATH] [--user UID:GID]
//                 [--gate-fd N [--lifeline]] BOUNDARY CMD [ARGS…]
//   nano-init supervise [--user UID:GID] [--gate-fd N [--lifeline]] CMD [ARGS…]
//   nano-init copy DEST
//   nano-init check
// Parsing is pure so that tests can check every refusal.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace nanoinit {

/// Where sam-box listens: a Unix socket path, or an AF_VSOCK CID:PORT (Firecracker guests),
/// one connection per flow; or one byte stream carrying every flow as an HTTP/2 stream
/// (issue 5, src/netstack/h2_mux.h): a Unix socket, or a character device.
struct Boundary {
  enum class Kind { kUnix, kVsock, kH2Unix, kH2Dev };
  Kind kind = Kind::kUnix;
  std::string unix_path;    ///< kUnix, kH2Unix
  std::string device_path;  ///< kH2Dev
  uint32_t vsock_cid = 0;
  uint32_t vsock_port = 0;
  [[nodiscard]] bool isVsock() const { return kind == Kind::kVsock; }
};

/// Parses "vsock://CID:PORT" (decimal, CID ≥ 2, port 1..4294967294), "h2+unix://PATH" (PATH a
/// Unix socket path as below), "h2+dev://PATH" (PATH absolute, no NUL, < 4096 bytes), or an
/// absolute or relative Unix socket path (non-empty, no NUL, < 108 bytes); any other
/// "scheme://" is refused. nullopt with `*reason` set.
std::optional<Boundary> parseBoundary(const std::string& text, std::string* reason);

struct RunOptions {
  bool create_namespaces = false;
  std::string ingress_socket;
  std::string boundary;  ///< as given; the netstack parses it again
  /// --user UID:GID: the agent runs as these ids (decimal, < 4294967295) with no supplementary
  /// group; nullopt = nano-init's own ids.
  std::optional<std::pair<uint32_t, uint32_t>> user;
  /// --gate-fd N (3..65535): nothing of the sandbox is set up, and CMD does not start, until
  /// gate.h's awaitGate(N) returns; a tun0 that comes with the line is the one adopted.
  std::optional<int> gate_fd;
  /// --lifeline (needs --gate-fd): the opened gate is kept, and its closing stops the sandbox
  /// (gate.h, Lifeline).
  bool lifeline = false;
  std::vector<std::string> command;
};

/// `nano-init supervise`: PID 1 duties only (pid1.h), with no network set-up at all, for a
/// sandbox whose egress is held by other means (the microVM tier's in-guest nftables).
struct SuperviseOptions {
  /// --user UID:GID, as for RunOptions::user.
  std::optional<std::pair<uint32_t, uint32_t>> user;
  /// --gate-fd N (3..65535): CMD starts only once gate.h's awaitGate(N) returns.
  std::optional<int> gate_fd;
  /// --lifeline (needs --gate-fd), as for RunOptions::lifeline.
  bool lifeline = false;
  std::vector<std::string> command;
};

struct CopyOptions {
  std::string dest;
};

/// `nano-init check` (check.h): no options.
struct CheckOptions {};

/// What main() should do after parsing: run, supervise, copy, check, or exit at once
/// (help/version/errors) with `exit_code`, having printed `message` (to stdout if exit_code is 0,
/// else stderr).
struct Exit {
  int exit_code = 0;
  std::string message;
};

using Parsed = std::variant<RunOptions, SuperviseOptions, CopyOptions, CheckOptions, Exit>;

Parsed parseCommandLine(int argc, const char* const* argv);

}  // namespace nanoinit
