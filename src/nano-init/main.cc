// nano-init: PID 1 of an agent sandbox (seed 003; issue 3). See README.md.

#include <linux/capability.h>
#include <unistd.h>
#include <asio/io_context.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/socket_path.h"
#include "nano-init/caps.h"
#include "nano-init/check.h"
#include "nano-init/copy_self.h"
#include "nano-init/errors.h"
#include "nano-init/gate.h"
#include "nano-init/namespaces.h"
#include "nano-init/options.h"
#include "nano-init/pid1.h"
#include "nano-init/resolv.h"
#include "nano-init/tun.h"
#include "vdns/virtual_dns.h"

#if NANO_INIT_HAVE_NETSTACK
#include "netstack/stack.h"
#endif

namespace nanoinit {
namespace {

constexpr const char* kResolvConf = "/etc/resolv.conf";
constexpr const char* kHosts = "/etc/hosts";

void note(const std::string& text) { (void)std::fprintf(stderr, "nano-init: %s\n", text.c_str()); }

// Runs `step`, prefixing any failure with its name, so the error says which step and why.
template <typename F>
auto step(const char* name, F&& f) {
  try {
    return f();
  } catch (const StepError& e) {
    throw StepError(std::string(name) + ": " + e.what());
  }
}

struct Sandbox {
  common::UniqueFd tun;
};

// The privileged set-up, in order. The order is the security argument: namespaces before
// the check that nothing but lo and tun0 is in ours, that before the device, the device before the
// routes through it, the resolver file before anything can read it, and capabilities are dropped
// only in the agent's own process (spawn, below).
[[maybe_unused]] Sandbox setUp(const RunOptions& opts, common::UniqueFd passed_tun) {
  Sandbox sb;
  bool own_pids = false;  // PID 1 of a PID namespace made here
  if (opts.create_namespaces) {
    // Root of the machine with CAP_SYS_ADMIN needs no user namespace for the rest, and
    // without one --user may name any uid (a namespace made here maps only our own).
    if (!(caps::isMachineRoot() && caps::hasCap(CAP_SYS_ADMIN))) {
      step("user namespace", [&] { namespaces::enterUserNamespace(opts.user); });
    }
    // Not PID 1 (by hand): PID 1 of a PID namespace of our own from here on, so that nothing
    // of the agent's can outlive the sandbox or signal nano-init.
    if (::getpid() != 1) {
      step("pid namespace", [] { namespaces::enterPidNamespace(); });
      own_pids = true;
    }
    step("network namespace", [] { namespaces::enterNetworkNamespace(); });
  }
  std::string why;
  // Always our own mount namespace: the resolv.conf bind must never land in the host's.
  const bool own_mounts = namespaces::enterMountNamespace(&why);
  if (own_pids && own_mounts) {
    std::string why_proc;
    if (!namespaces::mountOwnProc(&why_proc)) {
      note("the agent lists its launcher's processes in /proc (" + why_proc + ")");
    }
  }
  // Without one (a container without CAP_SYS_ADMIN) nothing needs saying unless a mount was
  // needed: the resolv.conf step below says so then.
  step("network namespace check", [] { tun::requireIsolatedNamespace(); });
  sb.tun = step("tun0", [&] { return tun::openTun(std::move(passed_tun)); });
  step("addresses and routes", [] { tun::configureNetwork(); });
  // The resolver files, each made right the same way (resolv.h).
  struct ResolverFile {
    const char* step;
    const char* path;
    resolv::Outcome (*ensure)(const std::string&, bool, std::string*);
  };
  for (const ResolverFile& file : {ResolverFile{"resolv.conf", kResolvConf, &resolv::ensure},
                                   ResolverFile{"hosts", kHosts, &resolv::ensureHosts}}) {
    step(file.step, [&] {
      std::string why_skipped;
      file.ensure(file.path, own_mounts, &why_skipped);
      if (!why_skipped.empty()) {
        note(why_skipped + (own_mounts ? "" : " (no mount namespace: " + why + ")"));
      }
    });
  }
  return sb;
}

// Exit status of a refusal to run the agent as root of the machine (a usage error).
constexpr int kUsage = 2;

// True (after saying why) when the agent would run as root of the machine: it must be asked
// for by name (--user 0:0), never be what nano-init happens to run as.
bool refuseMachineRoot(const char* sub, const std::optional<std::pair<uint32_t, uint32_t>>& user) {
  if (user || !caps::isMachineRoot()) return false;
  note(std::string(sub) +
       ": refusing to run the agent as uid 0 of this machine (no user namespace maps it to another "
       "uid): "
       "without a capability it would still own every root-owned file it can see and could "
       "signal every root process. Pass --user UID:GID (an unprivileged one, e.g. --user "
       "65534:65534), or --user 0:0 to run it as root all the same (a container's root, whose "
       "files are its own)");
  return true;
}

// The agent's process, just before exec: UID:GID if asked, then no capability at all.
void spawnAgent(Supervisor& supervisor, const std::vector<std::string>& command,
                const std::optional<std::pair<uint32_t, uint32_t>>& user) {
  supervisor.spawn(command, [&user] {
    if (user) caps::becomeUser(user->first, user->second);
    caps::dropAll();
  });
}

// `--lifeline`: the launcher's end of the opened gate closing stops the sandbox. Nothing when
// `fd` is not valid (no --lifeline).
std::unique_ptr<Lifeline> holdLifeline(asio::io_context& io, common::UniqueFd fd,
                                       Supervisor& supervisor) {
  if (!fd.valid()) return nullptr;
  return std::make_unique<Lifeline>(io, std::move(fd), [&supervisor] {
    note("the launcher is gone (its end of the gate closed): stopping the sandbox");
    supervisor.stopAll();
  });
}

// Notes for what is probably a slip; none stops the start.

// One of nano-init's options among the agent's words (after BOUNDARY): said before any
// refusal it may explain (`run SOCK --user 1:1 CMD` is refused for want of --user).
[[maybe_unused]] void warnOfMisplacedOptions(const RunOptions& opts) {
  for (const auto& word : opts.command) {
    for (const char* ours :
         {"--user", "--create-namespaces", "--ingress-socket", "--gate-fd", "--lifeline"}) {
      if (word == ours || word.rfind(std::string(ours) + "=", 0) == 0) {
        note(std::string(ours) + " after BOUNDARY is part of the agent's command, not an " +
             "option of nano-init's (they go before BOUNDARY)");
        return;
      }
    }
  }
}

// A BOUNDARY path with no socket (a typo, or BOUNDARY left out so that CMD's first word took
// its place). Not a refusal: a sandbox's sam-box may still be starting beside it, as in a pod.
[[maybe_unused]] void warnOfMissingBoundary(const RunOptions& opts) {
  std::string unused;
  const auto boundary = parseBoundary(opts.boundary, &unused);
  if (boundary && boundary->kind == Boundary::Kind::kUnix &&
      !common::isSocket(boundary->unix_path)) {
    note("BOUNDARY " + opts.boundary +
         " is no socket (yet): every flow is refused (boundary-unreachable) until sam-box "
         "serves it there");
  }
}

int run(const RunOptions& opts) {
#if !NANO_INIT_HAVE_NETSTACK
  (void)opts;
  note(
      "refusing to run: this nano-init was built without its network stack (src/netstack), "
      "so the agent would have no boundary");
  return 70;
#else
  warnOfMisplacedOptions(opts);
  if (refuseMachineRoot("run", opts.user)) return kUsage;
  blockHandledSignals();
  // The gate first: until the launcher says the boundary serves, nothing is set up (the
  // launcher may still be configuring tun0, which it then passes with the line).
  common::UniqueFd passed_tun;
  common::UniqueFd lifeline_fd;
  if (opts.gate_fd) passed_tun = awaitGate(*opts.gate_fd, opts.lifeline ? &lifeline_fd : nullptr);
  warnOfMissingBoundary(opts);  // after the gate: by then a launcher's sam-box serves
  asio::io_context io;
  Sandbox sb = setUp(opts, std::move(passed_tun));
  step("ptrace protection", [] { caps::protectFromAgent(); });
  // Supervisor before the netstack: signals are blocked before anything could fork.
  Supervisor supervisor(io);
  vdns::VirtualDns dns;
  netstack::Options net;
  net.tun_fd = sb.tun.release();
  net.boundary = opts.boundary;
  net.dns = &dns;
  net.ingress_socket = opts.ingress_socket;
  netstack::Stack stack(io, std::move(net));
  step("network stack", [&] { stack.start(); });
  spawnAgent(supervisor, opts.command, opts.user);
  int exit_code = 0;
  supervisor.start([&](int code) {
    exit_code = code;
    stack.stop();
    io.stop();
  });
  const auto lifeline = holdLifeline(io, std::move(lifeline_fd), supervisor);
  io.run();
  return exit_code;
#endif
}

// `nano-init supervise`: run()'s PID 1 duties and nothing else. No namespace, tun0, netstack or
// resolv.conf: the sandbox's egress is held by other means (nftables in the microVM guest or in
// the podman netns; `--gate-fd` holds the agent back until the launcher has armed it), so
// this needs no network stack in the build.
int supervise(const SuperviseOptions& opts) {
  if (refuseMachineRoot("supervise", opts.user)) return kUsage;
  blockHandledSignals();
  // The gate first: until the launcher says egress is armed, nothing of the agent's runs.
  common::UniqueFd lifeline_fd;
  if (opts.gate_fd && awaitGate(*opts.gate_fd, opts.lifeline ? &lifeline_fd : nullptr).valid()) {
    throw StepError("egress gate (fd " + std::to_string(*opts.gate_fd) +
                    "): a descriptor came with \"armed\", and supervise takes none; the agent "
                    "was not started");
  }
  step("ptrace protection", [] { caps::protectFromAgent(); });
  asio::io_context io;
  Supervisor supervisor(io);
  spawnAgent(supervisor, opts.command, opts.user);
  int exit_code = 0;
  supervisor.start([&](int code) {
    exit_code = code;
    io.stop();
  });
  const auto lifeline = holdLifeline(io, std::move(lifeline_fd), supervisor);
  io.run();
  return exit_code;
}

}  // namespace
}  // namespace nanoinit

int main(int argc, char** argv) {
  using namespace nanoinit;
  const Parsed parsed = parseCommandLine(argc, argv);
  if (const auto* exit = std::get_if<Exit>(&parsed)) {
    // A refusal is one line that names the program (CLI11's own already does).
    if (exit->exit_code != 0 && exit->message.rfind("nano-init: ", 0) != 0) {
      (void)std::fputs("nano-init: ", stderr);
    }
    (void)std::fputs(exit->message.c_str(), exit->exit_code == 0 ? stdout : stderr);
    return exit->exit_code;
  }
  try {
    if (std::holds_alternative<CheckOptions>(parsed)) return check::run();
    if (const auto* copy = std::get_if<CopyOptions>(&parsed)) {
      copySelf(copy->dest);
      return 0;
    }
    if (const auto* sup = std::get_if<SuperviseOptions>(&parsed)) return supervise(*sup);
    return run(std::get<RunOptions>(parsed));
  } catch (const std::exception& e) {
    // Fail closed: without every step the agent does not start.
    note(std::string("cannot start the sandbox: ") + e.what());
    return 70;
  }
}
