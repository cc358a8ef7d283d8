#include "sam-box/verifier.h"

#include "common/unique_fd.h"
#include "sam-box/limits.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX, for posix_spawn

namespace sambox {
namespace {

using Clock = std::chrono::steady_clock;

Verdict refused(const char* reason, std::string detail) {
  Verdict v;
  v.reason = reason;
  v.detail = std::move(detail);
  return v;
}

bool isKebab(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (const char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + ::strsignal(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

/// Waits for `pid` until `deadline`, then kills it. Returns its wait status, or -1 if it had
/// to be killed.
int reap(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

std::optional<std::string> readTokenFile(const std::string& path, std::string* why) {
  auto failed = [why](std::string text) -> std::optional<std::string> {
    if (why != nullptr) *why = std::move(text);
    return std::nullopt;
  };
  const common::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) return failed(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return failed("not a regular file");
  return readToken(fd.get(), why);
}

std::optional<std::string> readToken(int fd, std::string* why) {
  std::string text(kMaxTokenFileBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (why != nullptr) *why = std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

std::string unreadableTokenDetail(const std::string& path, const std::string& why) {
  return "--credential-path " + path + ": " + why;
}

std::string tokenTooLargeDetail(const std::string& path) {
  return unreadableTokenDetail(path,
                               "larger than " + std::to_string(kMaxTokenFileBytes) + " bytes");
}

std::string verdictLine(const Verdict& v) {
  nlohmann::json j;
  if (v.ok) {
    j = {{"verdict", "ok"},
         {"issuer", v.issuer},
         {"subject", v.subject},
         {"expires_at", v.expires_at}};
  } else {
    j = {{"verdict", "refused"}, {"reason", v.reason}, {"detail", v.detail}};
  }
  return j.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
}

Verdict parseVerdict(std::string_view text) {
  if (text.empty()) return refused(kReasonVerifierFailed, "the verifier wrote no verdict");
  if (text.size() > kMaxVerdictBytes) {
    return refused(kReasonVerifierFailed, "the verifier's verdict is too long");
  }
  if (text.back() != '\n' || text.find('\n') != text.size() - 1) {
    return refused(kReasonVerifierFailed, "the verifier's verdict is not one line");
  }
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return refused(kReasonVerifierFailed, "the verifier's verdict is not a JSON object");
  }
  const auto str = [&j](const char* key) -> const std::string* {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  const std::string* verdict = str("verdict");
  const auto exp = j.find("expires_at");
  if (verdict != nullptr && *verdict == "ok" && str("issuer") && str("subject") && exp != j.end() &&
      exp->is_number_integer() && exp->get<int64_t>() > 0 && j.size() == 4) {
    Verdict v;
    v.ok = true;
    v.issuer = *str("issuer");
    v.subject = *str("subject");
    v.expires_at = exp->get<int64_t>();
    return v;
  }
  if (verdict != nullptr && *verdict == "refused" && str("reason") && isKebab(*str("reason")) &&
      str("detail") && j.size() == 3) {
    return refused(str("reason")->c_str(), *str("detail"));
  }
  return refused(kReasonVerifierFailed, "the verifier's verdict is malformed");
}

std::string verifierPath() {
  std::array<char, 4096> buf{};
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return {};
  std::string self(buf.data(), static_cast<size_t>(n));
  const auto slash = self.rfind('/');
  if (slash == std::string::npos) return {};
  return self.substr(0, slash + 1) + kVerifierName;
}

Verdict verifyTokenFile(const std::string& helper, const IdentityCheck& check, std::string* token) {
  std::string why;
  std::optional<std::string> read = readTokenFile(check.token_path, &why);
  if (token != nullptr) *token = read.value_or(std::string());
  if (!read) return refused(kReasonUnreadableToken, unreadableTokenDetail(check.token_path, why));
  return runVerifier(helper, check, *read);
}

Verdict runVerifier(const std::string& helper, const IdentityCheck& check, std::string_view token,
                    std::chrono::milliseconds timeout) {
  if (helper.empty() || helper.front() != '/') {
    return refused(kReasonVerifierUnavailable,
                   "cannot locate " + std::string(kVerifierName) + " next to sam-box");
  }
  if (token.size() > kMaxTokenFileBytes) {
    return refused(kReasonUnreadableToken, tokenTooLargeDetail(check.token_path));
  }
  const auto deadline = Clock::now() + timeout;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return refused(kReasonVerifierUnavailable, std::string("pipe2: ") + std::strerror(errno));
  }
  common::UniqueFd out_r(fds[0]);
  common::UniqueFd out_w(fds[1]);
  // The token goes in whole before the helper starts: at most kMaxTokenFileBytes, well inside
  // a pipe's buffer (64 KiB, pipe(7)), so the write never waits for a reader.
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return refused(kReasonVerifierUnavailable, std::string("pipe2: ") + std::strerror(errno));
  }
  common::UniqueFd in_r(fds[0]);
  {
    common::UniqueFd in_w(fds[1]);
    if (!token.empty() &&
        ::write(in_w.get(), token.data(), token.size()) != static_cast<ssize_t>(token.size())) {
      return refused(kReasonVerifierUnavailable, std::string("writing the token to ") +
                                                     kVerifierName + ": " + std::strerror(errno));
    }
  }

  std::vector<std::string> args = {
      helper, kArgIssuer, check.issuer,  kArgAudience, check.audience,        kArgTokenPath,
      "-",    kArgCaFile, check.ca_file, kArgSubject,  check.expected_subject};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attr);
  ::posix_spawn_file_actions_adddup2(&actions, in_r.get(), STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&actions, out_w.get(), STDOUT_FILENO);
  // Nothing else of sam-box's: asio's sockets (the agent's tunnels, the node's) are not
  // close-on-exec, and the helper parses what the network sends it.
  ::posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  // sam-box ignores SIGPIPE; the helper starts with every signal at its default.
  sigset_t all;
  sigfillset(&all);
  sigset_t none;
  sigemptyset(&none);
  ::posix_spawnattr_setsigdefault(&attr, &all);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, helper.c_str(), &actions, &attr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  out_w.reset();
  in_r.reset();
  if (rc != 0) {
    return refused(kReasonVerifierUnavailable,
                   "cannot run the credential verifier " + helper + ": " + std::strerror(rc));
  }

  std::string text;
  std::array<char, 4096> buf{};
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out_r.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above ends the loop
    const ssize_t n = ::read(out_r.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf.data(), static_cast<size_t>(n));
    if (text.size() > kMaxVerdictBytes) break;  // parseVerdict refuses it
  }
  out_r.reset();
  const int status = reap(pid, timed_out ? Clock::now() : deadline);
  if (timed_out || status < 0) {
    return refused(kReasonVerifierTimeout, std::string(kVerifierName) + " did not finish within " +
                                               std::to_string(timeout.count() / 1000) + " s");
  }
  Verdict v = parseVerdict(text);
  const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const bool exited_refused = WIFEXITED(status) && WEXITSTATUS(status) == kVerifierExitRefused;
  if (v.ok && exited_ok) return v;
  if (!v.ok && v.reason != kReasonVerifierFailed && exited_refused) return v;
  if (v.ok || v.reason != kReasonVerifierFailed) {
    return refused(kReasonVerifierFailed, std::string(kVerifierName) + " " +
                                              describeStatus(status) +
                                              " and a verdict that does not match it");
  }
  return refused(kReasonVerifierFailed,
                 std::string(kVerifierName) + " " + describeStatus(status) + ": " + v.detail);
}

}  // namespace sambox
