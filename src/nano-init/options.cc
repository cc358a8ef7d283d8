#include "nano-init/options.h"

#include "common/cli_error.h"

#include <algorithm>

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstring>

namespace nanoinit {
namespace {

constexpr size_t kMaxUnixPath = 107;  // sizeof(sockaddr_un::sun_path) - 1
constexpr const char* kVsockScheme = "vsock://";
constexpr std::string_view kH2UnixScheme = "h2+unix://";
constexpr std::string_view kH2DevScheme = "h2+dev://";
constexpr size_t kMaxDevicePath = 4095;  // PATH_MAX - 1

bool validUnixPath(std::string_view path, std::string* reason) {
  if (path.empty() || path.size() > kMaxUnixPath || path.find('\0') != std::string::npos) {
    *reason = "a Unix socket path must be 1..107 bytes";
    return false;
  }
  return true;
}

bool parseU32(std::string_view s, uint32_t* out) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  uint64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  if (v > 0xFFFFFFFFULL) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

std::optional<Boundary> parseBoundary(const std::string& text, std::string* reason) {
  Boundary b;
  if (text.rfind(kVsockScheme, 0) == 0) {
    const std::string_view rest = std::string_view(text).substr(std::strlen(kVsockScheme));
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos || !parseU32(rest.substr(0, colon), &b.vsock_cid) ||
        !parseU32(rest.substr(colon + 1), &b.vsock_port)) {
      *reason = "expected vsock://CID:PORT with decimal numbers";
      return std::nullopt;
    }
    b.kind = Boundary::Kind::kVsock;
    // CIDs 0 and 1 are the hypervisor and local loopback; a guest dials the host at 2.
    if (b.vsock_cid < 2 || b.vsock_cid == 0xFFFFFFFF) {
      *reason = "vsock CID must be 2 or more (2 is the host)";
      return std::nullopt;
    }
    if (b.vsock_port == 0 || b.vsock_port == 0xFFFFFFFF) {
      *reason = "vsock port must be 1..4294967294";
      return std::nullopt;
    }
    return b;
  }
  const std::string_view view(text);
  if (view.starts_with(kH2UnixScheme)) {
    const std::string_view path = view.substr(kH2UnixScheme.size());
    if (!validUnixPath(path, reason)) return std::nullopt;
    b.kind = Boundary::Kind::kH2Unix;
    b.unix_path = std::string(path);
    return b;
  }
  if (view.starts_with(kH2DevScheme)) {
    const std::string_view path = view.substr(kH2DevScheme.size());
    if (path.empty() || path.front() != '/' || path.size() > kMaxDevicePath ||
        path.find('\0') != std::string::npos) {
      *reason = "expected h2+dev:///absolute/device/path (at most 4095 bytes, no NUL)";
      return std::nullopt;
    }
    b.kind = Boundary::Kind::kH2Dev;
    b.device_path = std::string(path);
    return b;
  }
  if (text.find("://") != std::string::npos) {
    *reason = "unknown scheme (only vsock://, h2+unix://, h2+dev:// or a Unix socket path)";
    return std::nullopt;
  }
  if (!validUnixPath(text, reason)) return std::nullopt;
  b.unix_path = text;
  return b;
}

namespace {

// Where CMD starts: in `nano-init run [OPTIONS] BOUNDARY CMD…` after the first word that is not
// an option or an option's value; in `nano-init supervise [OPTIONS] CMD…` at that word. A `--`
// ends the options, so a CMD that begins with "-" is still the agent's; in run, one `--` right
// after BOUNDARY (`run SOCKET -- CMD…`, as operators write for compass-runner) is a separator
// too, never the command. CLI11
// sees only the words before it: its prefix_command() still takes known options found after a
// positional, so `run BOUNDARY --help` would print nano-init's help instead of running the
// agent's `--help`.
struct Split {
  int parsed_end;  // CLI11 parses argv[0, parsed_end)
  int cmd_start;   // CMD is argv[cmd_start, argc)
};

// run: CMD starts after BOUNDARY at argv[boundary], and after one `--` that follows it (which
// CLI11 does not see: after its own `--` it would count a second one as a positional).
Split afterBoundary(int argc, const char* const* argv, int boundary) {
  if (boundary >= argc) return {argc, argc};
  const int next = boundary + 1;
  if (next < argc && std::string_view(argv[next]) == "--") return {next, next + 1};
  return {next, next};
}

Split commandStart(int argc, const char* const* argv) {
  if (argc < 2) return {argc, argc};
  const std::string_view sub = argv[1];
  if (sub != "run" && sub != "supervise") return {argc, argc};
  for (int i = 2; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--user" || word == "--gate-fd" || (sub == "run" && word == "--ingress-socket")) {
      ++i;  // its value
      continue;
    }
    if (word == "--") {  // the end of our options: BOUNDARY (run) or CMD (supervise) follows
      if (sub == "supervise") return {i + 1, i + 1};
      return afterBoundary(argc, argv, i + 1);
    }
    if (word.starts_with("-")) continue;  // a flag, or --option=value
    // run: argv[i] is BOUNDARY; supervise: argv[i] is CMD.
    return sub == "run" ? afterBoundary(argc, argv, i) : Split{i, i};
  }
  return {argc, argc};
}

// --user UID:GID (run and supervise): decimal, each < 4294967295 (that is (uid_t)-1, "no
// change" to setresuid). nullopt if malformed.
std::optional<std::pair<uint32_t, uint32_t>> parseUser(std::string_view text) {
  const size_t colon = text.find(':');
  uint32_t uid = 0, gid = 0;
  if (colon == std::string_view::npos || !parseU32(text.substr(0, colon), &uid) ||
      !parseU32(text.substr(colon + 1), &gid) || uid == 0xFFFFFFFF || gid == 0xFFFFFFFF) {
    return std::nullopt;
  }
  return std::make_pair(uid, gid);
}

std::string badUser(const char* sub, const std::string& text) {
  return std::string(sub) + ": invalid --user '" + text + "': expected UID:GID, decimal numbers\n";
}

constexpr const char* kLifelineHelp =
    "Keep the --gate-fd descriptor once it opened; when the launcher closes its end (or dies), "
    "stop the sandbox as on SIGTERM: every process gets SIGTERM, then SIGKILL after the grace "
    "period";

constexpr const char* kUserHelp =
    "Run CMD as UID:GID (decimal) with no supplementary group (default: ours)";

// --gate-fd N (run and supervise): 3..65535. nullopt with the message to print if malformed.
std::optional<int> parseGateFd(const char* sub, const std::string& text, std::string* error) {
  uint32_t fd = 0;
  if (!parseU32(text, &fd) || fd < 3 || fd > 65535) {
    *error = std::string(sub) + ": invalid --gate-fd '" + text +
             "': expected a descriptor number from 3 to 65535\n";
    return std::nullopt;
  }
  return static_cast<int>(fd);
}

}  // namespace

Parsed parseCommandLine(int argc, const char* const* argv) {
  CLI::App app{"nano-init: PID 1 of an agent sandbox (tun0, userspace TCP/IP, virtual DNS)",
               "nano-init"};
  app.set_version_flag("--version", std::string("nano-init ") + COMPASS_VERSION);
  app.require_subcommand(1);

  RunOptions run;
  auto* run_cmd = app.add_subcommand(
      "run", "Run CMD as the sandbox's only process tree; every flow goes to BOUNDARY");
  run_cmd->add_flag("--create-namespaces", run.create_namespaces,
                    "Create the sandbox's namespaces: network (only lo and tun0), mount, IPC, "
                    "UTS, a PID namespace when not PID 1, and a user namespace unless root with "
                    "CAP_SYS_ADMIN");
  run_cmd->add_option("--ingress-socket", run.ingress_socket,
                      "Serve this Unix socket; each connection goes to 127.0.0.1:<port> inside "
                      "(default: none)");
  std::string user;
  auto* user_opt = run_cmd->add_option("--user", user, kUserHelp);
  std::string run_gate_fd;
  auto* run_gate_fd_opt =
      run_cmd
          ->add_option("--gate-fd", run_gate_fd,
                       "Set up the sandbox and start CMD only once the line \"armed\" arrives on "
                       "this inherited descriptor (3 or above), adopting a tun0 passed with it; if "
                       "it is closed first, exit 70 without starting CMD (default: none)")
          ->type_name("FD");
  run_cmd->add_flag("--lifeline", run.lifeline, kLifelineHelp);
  run_cmd
      ->add_option("boundary", run.boundary,
                   "sam-box: a Unix socket path, vsock://CID:PORT, h2+unix://PATH or h2+dev://PATH")
      ->required();
  run_cmd->footer(
      "CMD [ARGS…] follow BOUNDARY (after an optional --); everything after is passed through.");

  SuperviseOptions supervise;
  auto* supervise_cmd = app.add_subcommand(
      "supervise",
      "Run CMD as PID 1's only child without any network set-up (the sandbox's egress is held "
      "elsewhere): reaping, signals, exit status");
  std::string supervise_user;
  auto* supervise_user_opt = supervise_cmd->add_option("--user", supervise_user, kUserHelp);
  std::string gate_fd;
  auto* gate_fd_opt =
      supervise_cmd
          ->add_option(
              "--gate-fd", gate_fd,
              "Start CMD only once the line \"armed\" arrives on this inherited descriptor (3 or "
              "above); if it is closed first, exit 70 without starting CMD (default: none, CMD "
              "starts "
              "at once)")
          ->type_name("FD");
  supervise_cmd->add_flag("--lifeline", supervise.lifeline, kLifelineHelp);
  supervise_cmd->footer(
      "CMD [ARGS…] follow the options; everything from CMD on is passed through.");

  CopyOptions copy;
  auto* copy_cmd = app.add_subcommand("copy", "Copy this binary to DEST (mode 0755)");
  copy_cmd->add_option("dest", copy.dest, "Destination path")->required();

  auto* check_cmd = app.add_subcommand(
      "check", "Say whether this process is inside a nano-init sandbox (exit 0) or not (exit 1)");

  const auto [parsed_end, cmd_start] = commandStart(argc, argv);
  try {
    app.parse(parsed_end, argv);
  } catch (const CLI::ParseError& e) {
    // --help/--version exit 0; every usage error is 2, whatever CLI11's own code for it.
    const common::ParseErrorReport r = common::describeParseError(app, e, "nano-init", 2);
    return Exit{r.status, r.status == 0 ? r.out : r.err + r.out};
  }
  if (*copy_cmd) return copy;
  if (*check_cmd) return CheckOptions{};
  if (*supervise_cmd) {
    supervise.command.assign(argv + cmd_start, argv + argc);
    if (supervise.command.empty()) return Exit{2, "supervise: CMD is required\n"};
    if (supervise_user_opt->count() > 0) {
      supervise.user = parseUser(supervise_user);
      if (!supervise.user) return Exit{2, badUser("supervise", supervise_user)};
    }
    if (gate_fd_opt->count() > 0) {
      std::string error;
      supervise.gate_fd = parseGateFd("supervise", gate_fd, &error);
      if (!supervise.gate_fd) return Exit{2, error};
    }
    if (supervise.lifeline && !supervise.gate_fd) {
      return Exit{2, "supervise: --lifeline needs --gate-fd (the lifeline is the opened gate)\n"};
    }
    return supervise;
  }
  run.command.assign(argv + cmd_start, argv + argc);
  if (run.command.empty()) return Exit{2, "run: CMD is required\n"};
  if (user_opt->count() > 0) {
    run.user = parseUser(user);
    if (!run.user) return Exit{2, badUser("run", user)};
  }
  if (run_gate_fd_opt->count() > 0) {
    std::string error;
    run.gate_fd = parseGateFd("run", run_gate_fd, &error);
    if (!run.gate_fd) return Exit{2, error};
  }
  if (run.lifeline && !run.gate_fd) {
    return Exit{2, "run: --lifeline needs --gate-fd (the lifeline is the opened gate)\n"};
  }
  std::string reason;
  if (!parseBoundary(run.boundary, &reason)) {
    return Exit{2, "run: invalid BOUNDARY '" + run.boundary + "': " + reason + "\n"};
  }
  return run;
}

}  // namespace nanoinit
