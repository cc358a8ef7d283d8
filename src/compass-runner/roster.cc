#include "compass-runner/roster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/podman_cli.h"
#include "compass-runner/process.h"
#include "policy/name.h"

namespace runner {
namespace {

constexpr size_t kMaxMetricsBytes = size_t{4} << 20;
constexpr auto kStopPoll = std::chrono::milliseconds(50);

void say(const std::string& line) {
  (void)std::fprintf(stderr, "compass-runner: %s\n", line.c_str());
}

int64_t nowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The value of label `key` in a Prometheus label set `{a="x",b="y"}` (no escapes expected:
// sam-box's label values are fixed words).
std::string_view labelValue(std::string_view labels, std::string_view key) {
  const std::string pattern = std::string(key) + "=\"";
  size_t pos = 0;
  while ((pos = labels.find(pattern, pos)) != std::string_view::npos) {
    if (pos == 0 || labels[pos - 1] == '{' || labels[pos - 1] == ',') {
      const size_t start = pos + pattern.size();
      const size_t end = labels.find('"', start);
      if (end == std::string_view::npos) return {};
      return labels.substr(start, end - start);
    }
    pos += pattern.size();
  }
  return {};
}

// Shell-like rendering of a command for the table: words with spaces or quotes are quoted.
std::string showCommand(const std::vector<std::string>& command) {
  std::string out;
  for (const auto& word : command) {
    if (!out.empty()) out += ' ';
    const bool plain = !word.empty() && word.find_first_not_of(
                                            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                            "0123456789-_./=:,+@%") == std::string::npos;
    if (plain) {
      out += word;
      continue;
    }
    // A control character (a newline, an escape) would draw a row of its own or drive the
    // operator's terminal: such a word is shown as bash's $'…' with \xNN escapes.
    if (std::any_of(word.begin(), word.end(), isControlByte)) {
      out += "$'";
      for (const char c : word) {
        const auto u = static_cast<unsigned char>(c);
        if (isControlByte(c)) {
          static constexpr char kHex[] = "0123456789abcdef";
          out.append("\\x").push_back(kHex[u >> 4]);
          out.push_back(kHex[u & 0xf]);
        } else {
          if (c == '\\' || c == '\'') out.push_back('\\');
          out.push_back(c);
        }
      }
      out += '\'';
      continue;
    }
    out += '\'';
    for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

uid_t ownerOf(const std::string& path);

// For a caller who is not root: the podman and microvm tiers' records lie under root's 0700
// state root, which readRecords() does not (cannot) look into. "" when there is none, or the
// caller owns it.
std::string unseenRootHint() {
  if (::geteuid() == 0) return "";
  const std::string root = stateRoot("podman");
  const uid_t owner = ownerOf(root);
  if (owner == static_cast<uid_t>(-1) || owner == ::geteuid()) return "";
  return "; agents of the podman and microvm tiers are recorded under " + root + ", which " +
         "belongs to uid " + std::to_string(owner) + ": run this as that user to see them";
}

// The live record with `id`, or nullopt after saying why there is none.
std::optional<AgentRecord> findLive(std::string_view verb, const std::string& id) {
  for (auto& rec : readRecords()) {
    if (rec.id != id) continue;
    if (runnerAlive(rec)) return rec;
    say(std::string(verb) + ": agent " + id + " is not running (its runner, pid " +
        std::to_string(rec.runner_pid) + ", is gone); `compass-runner gc` removes what it left");
    return std::nullopt;
  }
  say(std::string(verb) + ": no live agent with id \"" + id +
      "\" (`compass-runner agents` lists them)" + unseenRootHint());
  return std::nullopt;
}

uid_t ownerOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

}  // namespace

FlowCounts parseFlowCounts(std::string_view text) {
  FlowCounts counts;
  constexpr std::string_view kMetric = "sam_box_flows_total";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.substr(0, kMetric.size()) != kMetric || line.size() <= kMetric.size() ||
        line[kMetric.size()] != '{') {
      continue;
    }
    const size_t close = line.find('}');
    if (close == std::string_view::npos) continue;
    const std::string_view labels = line.substr(kMetric.size(), close - kMetric.size() + 1);
    std::string value(line.substr(close + 1));
    char* parse_end = nullptr;
    const double v = std::strtod(value.c_str(), &parse_end);
    if (parse_end == value.c_str() || !(v >= 0) || v > 1e18) continue;
    const std::string_view outcome = labelValue(labels, "outcome");
    if (outcome == "allowed") counts.allowed += static_cast<uint64_t>(v);
    if (outcome == "denied") counts.denied += static_cast<uint64_t>(v);
  }
  return counts;
}

std::optional<std::string> httpBody(std::string_view response) {
  const size_t head_end = response.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return std::nullopt;
  const std::string_view head = response.substr(0, head_end);
  const size_t eol = head.find("\r\n");
  const std::string_view status = head.substr(0, eol);
  if (status.substr(0, 7) != "HTTP/1." || status.size() < 12 || status.substr(8, 4) != " 200" ||
      (status.size() > 12 && status[12] != ' ')) {
    return std::nullopt;
  }
  std::string body(response.substr(head_end + 4));
  std::string lower(head);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("\r\ntransfer-encoding:") != std::string::npos) return std::nullopt;
  const size_t cl = lower.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    const size_t length = std::strtoull(lower.c_str() + cl + 17, nullptr, 10);
    if (length > body.size()) return std::nullopt;  // cut short
    body.resize(length);
  }
  return body;
}

std::optional<FlowCounts> scrapeFlowCounts(const std::string& addr,
                                           std::chrono::milliseconds timeout) {
  const auto authority = policy::parseAuthority(addr);
  if (!authority) return std::nullopt;
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, authority->host.c_str(), &v4->sin_addr) == 1) {
    if ((ntohl(v4->sin_addr.s_addr) >> 24) != 127) return std::nullopt;
    v4->sin_family = AF_INET;
    v4->sin_port = htons(authority->port);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, authority->host.c_str(), &v6->sin6_addr) == 1) {
    if (!IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr)) return std::nullopt;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(authority->port);
    len = sizeof *v6;
  } else {
    return std::nullopt;  // loopback literals only: never a name to resolve
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
               .count()));
  };
  common::UniqueFd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return std::nullopt;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS) return std::nullopt;
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, left()) <= 0) return std::nullopt;
    int err = 0;
    socklen_t elen = sizeof err;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
      return std::nullopt;
    }
  }
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n\r\n";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return std::nullopt;
  }
  std::string response;
  char buf[16384];
  for (;;) {
    pollfd p{fd.get(), POLLIN, 0};
    const int t = left();
    if (t == 0 || ::poll(&p, 1, t) <= 0) return std::nullopt;
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
    if (response.size() > kMaxMetricsBytes) return std::nullopt;
  }
  const auto body = httpBody(response);
  if (!body) return std::nullopt;
  return parseFlowCounts(*body);
}

std::string formatUptime(int64_t s) {
  if (s < 0) s = 0;
  char buf[32];
  if (s < 60) {
    (void)std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    (void)std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                        static_cast<long long>(s % 60));
  } else if (s < 86400) {
    (void)std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                        static_cast<long long>(s % 3600 / 60));
  } else {
    (void)std::snprintf(buf, sizeof buf, "%lldd%02lldh", static_cast<long long>(s / 86400),
                        static_cast<long long>(s % 86400 / 3600));
  }
  return buf;
}

std::string formatTable(const std::vector<RosterEntry>& entries) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "TIER", "EGRESS", "PID", "UPTIME", "ALLOWED", "DENIED", "COMMAND"}};
  for (const auto& e : entries) {
    rows.push_back(
        {e.rec.id, e.rec.tier, e.rec.posture, std::to_string(e.rec.pid), formatUptime(e.uptime_s),
         e.flows ? std::to_string(e.flows->allowed) : std::string("-"),
         e.flows ? std::to_string(e.flows->denied) : std::string("-"), showCommand(e.rec.command)});
  }
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string formatJson(const std::vector<RosterEntry>& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : entries) {
    out.push_back({
        {"id", e.rec.id},
        {"tier", e.rec.tier},
        {"egress", e.rec.posture},
        {"egress_armed_in_guest", e.rec.egress_armed_in_guest},
        {"pid", e.rec.pid},
        {"uptime_s", e.uptime_s},
        {"allowed", e.flows ? nlohmann::json(e.flows->allowed) : nlohmann::json(nullptr)},
        {"denied", e.flows ? nlohmann::json(e.flows->denied) : nlohmann::json(nullptr)},
        {"command", e.rec.command},
        {"agent_id", e.rec.agent_id},
        {"runner_pid", e.rec.runner_pid},
        {"state_dir", e.rec.state_dir},
        {"metrics_addr", e.rec.metrics_addr},
    });
  }
  return out.dump(2) + "\n";
}

std::vector<RosterEntry> liveAgents() {
  std::vector<RosterEntry> out;
  const int64_t now = nowUnixMs();
  for (auto& rec : readRecords()) {
    if (!runnerAlive(rec)) continue;
    RosterEntry e;
    e.uptime_s = (now - rec.started_unix_ms) / 1000;
    if (!rec.metrics_addr.empty()) e.flows = scrapeFlowCounts(rec.metrics_addr);
    e.rec = std::move(rec);
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const RosterEntry& a, const RosterEntry& b) {
    return a.rec.started_unix_ms < b.rec.started_unix_ms;
  });
  return out;
}

int listAgents(const AgentsOptions& opts) {
  const auto entries = liveAgents();
  const std::string text = opts.json ? formatJson(entries) : formatTable(entries);
  (void)std::fputs(text.c_str(), stdout);
  // A killed runner's agent is not listed (it has no runner to answer for it), but what it
  // left may still run: say so, on stderr, so that the table alone is never the whole story.
  std::vector<std::string> dead;
  std::vector<std::string> unreadable;
  for (const auto& rec : readRecords(&unreadable)) {
    if (!runnerAlive(rec)) dead.push_back(rec.id);
  }
  for (const auto& dir : unreadable) {
    // Its agent may be running: the table cannot say, so this line does.
    std::string text = "agents: ";
    text.append(dir).append("/agent.json cannot be read as an agent record; its agent, if it ");
    say(text.append("runs, is not listed (gc leaves it alone)"));
  }
  if (!dead.empty()) {
    std::string ids;
    for (const auto& id : dead) ids += (ids.empty() ? "" : ", ") + id;
    say("agents: " + std::to_string(dead.size()) + " agent(s) whose runner is gone (" + ids +
        "); `compass-runner gc` removes what they left");
  }
  if (const std::string hint = unseenRootHint(); !hint.empty()) {
    say("agents: only agents of uid " + std::to_string(::geteuid()) + " are listed" + hint);
  }
  return 0;
}

int stopAgent(const StopOptions& opts) {
  const auto rec = findLive("stop", opts.id);
  if (!rec) return 1;
  // A host-tier agent can edit its own record: signal only a runner of the uid that owns
  // the state dir, which that uid could signal itself.
  const uid_t owner = ownerOf(rec->state_dir);
  if (owner != ownerOf("/proc/" + std::to_string(rec->runner_pid))) {
    say("stop: agent " + opts.id + ": its runner (pid " + std::to_string(rec->runner_pid) +
        ") does not run as the owner of " + rec->state_dir + "; not signalling it");
    return 1;
  }
  if (::kill(rec->runner_pid, SIGTERM) != 0) {
    say("stop: signalling runner pid " + std::to_string(rec->runner_pid) + ": " +
        std::strerror(errno));
    return 1;
  }
  const auto deadline = std::chrono::steady_clock::now() + kStopWait;
  while (runnerAlive(*rec)) {
    if (std::chrono::steady_clock::now() > deadline) {
      say("stop: agent " + opts.id + ": its runner (pid " + std::to_string(rec->runner_pid) +
          ") has not ended after " + std::to_string(kStopWait.count()) + " s");
      return 1;
    }
    std::this_thread::sleep_for(kStopPoll);
  }
  if (readRecord(rec->state_dir)) {
    say("stop: agent " + opts.id + ": its runner ended without removing " + rec->state_dir +
        "; `compass-runner gc` removes it");
    return 1;
  }
  (void)std::fprintf(stderr, "compass-runner: stopped agent %s\n", opts.id.c_str());
  return 0;
}

int resizeAgent(const ResizeOptions& opts) {
  const auto rec = findLive("resize", opts.id);
  if (!rec) return 1;
  try {
    selectBackend(rec->tier, nullptr)->resize(*rec, opts.resources);
  } catch (const std::exception& e) {
    say("resize: agent " + opts.id + " (tier " + rec->tier + "): " + e.what());
    return 1;
  }
  // What is now in force, as the cgroup holds it (podman inspect keeps the start's values).
  std::string set;
  const Resources& r = opts.resources;
  auto add = [&set](const std::string& what) { set += (set.empty() ? "" : ", ") + what; };
  if (r.memory_bytes) add("memory " + std::to_string(*r.memory_bytes) + " bytes");
  if (r.cpus) add("cpus " + podman::cpusFlag(*r.cpus));  // as `podman update --cpus` was given it
  if (r.pids) add("pids " + std::to_string(*r.pids));
  (void)std::fprintf(stderr, "compass-runner: resized agent %s: %s\n", opts.id.c_str(),
                     set.c_str());
  return 0;
}

int collectGarbage() {
  int failures = 0;
  std::vector<std::string> live_ids;
  std::vector<std::string> unreadable;
  const auto records = readRecords(&unreadable);
  for (const auto& dir : unreadable) {
    // Whether its runner lives cannot be told: left alone, whatever of it is running.
    std::string text = "gc: ";
    text.append(dir).append("/agent.json cannot be read as an agent record; its agent is left ");
    text.append("alone. Once you know it is not running, remove ").append(dir);
    say(text.append(" and run gc again"));
  }
  for (const auto& rec : records) {
    if (runnerAlive(rec)) live_ids.push_back(rec.id);
  }
  for (const auto& rec : records) {
    if (std::find(live_ids.begin(), live_ids.end(), rec.id) != live_ids.end()) continue;
    try {
      selectBackend(rec.tier, nullptr)->reap(rec);
      removeStateDir(rec.state_dir);
      std::printf("removed agent %s (tier %s; its runner, pid %d, is gone): %s\n", rec.id.c_str(),
                  rec.tier.c_str(), rec.runner_pid, rec.state_dir.c_str());
    } catch (const std::exception& e) {
      say("gc: agent " + rec.id + " (tier " + rec.tier + "): " + e.what());
      ++failures;
    }
  }
  std::vector<std::string> skipped_roots;  // podman and microvm share one root: say it once
  for (const auto& name : {"host", "podman", "microvm"}) {
    // A tier's leftovers belong to the uid that owns its state root (root for podman and
    // microvm): another user can neither see nor remove them, so does not try.
    const std::string root = stateRoot(name);
    const uid_t owner = ownerOf(root);
    if (::geteuid() != 0 && owner != ::geteuid()) {
      if (owner != static_cast<uid_t>(-1) &&
          std::find(skipped_roots.begin(), skipped_roots.end(), root) == skipped_roots.end()) {
        skipped_roots.push_back(root);
        say("gc: skipping " + root +
            (std::string_view(name) == "host" ? " (host-tier agents)"
                                              : " (podman/microvm agents)") +
            ": it belongs to uid " + std::to_string(owner) + "; run gc as that user to reap it");
      }
      continue;
    }
    std::unique_ptr<Backend> backend;
    try {
      backend = selectBackend(std::string(name), nullptr);
    } catch (const RunnerError&) {
      continue;  // a tier not available in this build left nothing to reap
    }
    try {
      backend->reapOrphans(live_ids);
    } catch (const std::exception& e) {
      say(std::string("gc: ") + name + " tier: " + e.what());
      ++failures;
    }
  }
  (void)std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace runner
