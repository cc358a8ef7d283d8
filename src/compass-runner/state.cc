#include "compass-runner/state.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"

namespace runner {
namespace {

constexpr size_t kAgentIdHexDigits = 10;
constexpr const char* kRecordFile = "agent.json";
constexpr const char* kDefaultRoot = "/run/compass-runner";
constexpr size_t kMaxRecordBytes = size_t{1} << 20;
// The agent's command is in its record for the roster to show, not to run it again: at most
// this many of its bytes are kept, so a record stays far below kMaxRecordBytes even when every
// byte becomes a six-byte JSON escape (a record over the cap would read as no record at all).
constexpr size_t kMaxRecordedCommandBytes = 8192;
// What an argument costs beyond its bytes in the record (quotes, comma, newline, indent): a
// command of many empty arguments is bounded too.
constexpr size_t kRecordedArgumentCost = 8;
// A state dir deeper than this is not removed (each level holds a descriptor while it is
// emptied); the error names the dir so an operator can remove it by hand.
constexpr int kMaxRemoveDepth = 512;

std::string errnoText(int err) { return std::strerror(err); }

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : std::string(fallback);
}

/// True if `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
/// U+10FFFF).
bool isUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      ++i;
      continue;
    }
    if ((b & 0xE0) == 0xC0) {
      n = 1, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 2, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 3, cp = b & 0x07;
    } else {
      return false;
    }
    if (i + n >= text.size()) return false;  // cut short
    for (size_t k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

/// Refuses a state root that is not absolute (it would be made below the caller's working
/// directory) or holds a control byte (the root is one line of /run/compass-roots' records,
/// state_roots.h, and of messages). `variable` names where it came from.
void checkRootText(const std::string& root, const char* variable) {
  if (root.empty() || root.front() != '/') {
    throw SpecRefused("state root \"" + root + "\" is not an absolute path (" + variable +
                      " must be absolute)");
  }
  if (std::any_of(root.begin(), root.end(), isControlByte)) {
    throw SpecRefused(std::string("state root: ") + variable +
                      " must not hold control characters (a newline, a tab, …)");
  }
}

std::string readSmallFile(const std::string& path, size_t cap) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string text(cap + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text.size() > cap ? std::string() : text;
}

// Empties and removes `name` under `parent_fd` without following symlinks: a symlink is
// removed as a link, never entered. Directories the agent made unreadable are opened up
// first (they are ours: the state dir belongs to the runner's uid).
void removeAt(int parent_fd, const std::string& name, const std::string& shown, int depth) {
  if (::unlinkat(parent_fd, name.c_str(), 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR && errno != EPERM) {
    throw RunnerError("removing " + shown + ": " + errnoText(errno));
  }
  if (depth > kMaxRemoveDepth) {
    throw RunnerError("removing " + shown + ": more than " + std::to_string(kMaxRemoveDepth) +
                      " levels deep; remove it by hand");
  }
  // unlinkat() said EISDIR, so this is a real directory (a symlink would have been unlinked).
  ::fchmodat(parent_fd, name.c_str(), 0700, 0);
  common::UniqueFd fd(
      ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return;
    throw RunnerError("removing " + shown + ": " + errnoText(errno));
  }
  // fdopendir() takes ownership of its descriptor, so give it a duplicate.
  DIR* dir = ::fdopendir(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (dir == nullptr) throw RunnerError("reading " + shown + ": " + errnoText(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
  }
  ::closedir(dir);
  for (const auto& child : names) {
    removeAt(fd.get(), child, std::string(shown).append("/").append(child), depth + 1);
  }
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    throw RunnerError("removing " + shown + ": " + errnoText(errno));
  }
}

template <typename T>
T field(const nlohmann::json& j, const char* key, bool required, T fallback = T()) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw RunnerError(std::string("agent.json: missing key \"") + key + "\"");
    return fallback;
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw RunnerError(std::string("agent.json: key \"") + key + "\" has the wrong type");
  }
}

}  // namespace

std::string stateRoot(const std::string& tier) {
  const bool host = tier == "host";
  std::string root =
      host ? envOr("TMPDIR", "/tmp") + "/compass-host" : envOr("COMPASS_STATE_DIR", kDefaultRoot);
  checkRootText(root, host ? "TMPDIR" : "COMPASS_STATE_DIR");
  return root;
}

bool isAgentId(std::string_view id) {
  if (id.size() != 1 + kAgentIdHexDigits || id.front() != 'a') return false;
  for (char c : id.substr(1)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string newAgentId() {
  unsigned char bytes[kAgentIdHexDigits / 2];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw RunnerError("getrandom: " + errnoText(errno));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "a";
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 0xF];
  }
  return id;
}

void checkStateRoot(const std::string& root, bool binds_sockets) {
  checkRootText(root, "TMPDIR or COMPASS_STATE_DIR");
  if (!binds_sockets) return;
  // Both reach podman (`--volume SRC:DEST:ro`, which splits at ':') and conmon, which refuses
  // a path that is not UTF-8: refused here rather than by them, after the root was made.
  if (!isUtf8(root)) {
    throw RunnerError("COMPASS_STATE_DIR must be UTF-8 (conmon refuses other paths)");
  }
  if (root.find(':') != std::string::npos) {
    throw RunnerError("COMPASS_STATE_DIR \"" + root +
                      "\": must not hold ':' (podman's --volume SRC:DEST splits at it)");
  }
  if (root.size() > kMaxStateRootBytes) {
    throw RunnerError("COMPASS_STATE_DIR \"" + root + "\" is " + std::to_string(root.size()) +
                      " bytes; at most " + std::to_string(kMaxStateRootBytes) +
                      " fit, since the agent's sockets below it must fit a Unix socket path "
                      "(107 bytes)");
  }
}

std::string createStateDir(const std::string& root, const std::string& id) {
  checkRootText(root, "TMPDIR or COMPASS_STATE_DIR");
  if (!isAgentId(id)) throw RunnerError("state dir: \"" + id + "\" is not an agent id");
  // A root that vanished between the steps was removed as empty by the end of another run
  // (removeStateRootIfEmpty): made again, a few times.
  constexpr int kAttempts = 4;
  const auto notOurs = [&root](uid_t owner) {
    throw RunnerError("state root " + root + " is owned by uid " + std::to_string(owner) +
                      ", not by this runner (uid " + std::to_string(::geteuid()) +
                      "); that root is shared, so set TMPDIR to a private directory");
  };
  for (int attempt = 1;; ++attempt) {
    if (::mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
      throw RunnerError("cannot create state root " + root + ": " + errnoText(errno));
    }
    // Checked on the opened directory, so the checks and the mkdirat() below are about the
    // same object even if someone renames things in between.
    common::UniqueFd fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ENOENT && attempt < kAttempts) continue;
      struct stat lst {};
      if (::lstat(root.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
        throw RunnerError("state root " + root +
                          " is a symlink; refusing it (someone else may control where it "
                          "points). Set TMPDIR to a private directory");
      }
      if (::lstat(root.c_str(), &lst) == 0 && lst.st_uid != ::geteuid()) notOurs(lst.st_uid);
      throw RunnerError("state root " + root + ": " + errnoText(err));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw RunnerError("state root " + root + ": fstat failed");
    if (st.st_uid != ::geteuid()) notOurs(st.st_uid);
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      char mode[8];
      (void)std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
      throw RunnerError("state root " + root + " is group- or world-writable (mode " + mode +
                        "); others could replace agents' state dirs. Use a private directory "
                        "(chmod 700, or set TMPDIR to one)");
    }
    if (::mkdirat(fd.get(), id.c_str(), 0700) != 0) {
      if (errno == ENOENT && attempt < kAttempts) continue;
      throw RunnerError("cannot create state dir " + std::string(root).append("/").append(id) +
                        ": " + errnoText(errno));
    }
    return std::string(root).append("/").append(id);
  }
}

void removeStateRootIfEmpty(const std::string& root) noexcept { (void)::rmdir(root.c_str()); }

std::vector<std::string> recordedCommand(const std::vector<std::string>& command) {
  std::vector<std::string> kept;
  size_t used = 0;
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& arg = command[i];
    if (used + kRecordedArgumentCost + arg.size() <= kMaxRecordedCommandBytes) {
      kept.push_back(arg);
      used += kRecordedArgumentCost + arg.size();
      continue;
    }
    const size_t room =
        kMaxRecordedCommandBytes - std::min(kMaxRecordedCommandBytes, used + kRecordedArgumentCost);
    size_t bytes_left = arg.size() - std::min(room, arg.size());
    for (size_t j = i + 1; j < command.size(); ++j) bytes_left += command[j].size();
    if (room > 0) kept.push_back(arg.substr(0, room));
    kept.push_back("[" + std::to_string(command.size() - i - (room > 0 ? 1 : 0)) +
                   " more arguments, " + std::to_string(bytes_left) + " more bytes not recorded]");
    break;
  }
  return kept;
}

std::string recordText(const AgentRecord& rec) {
  const nlohmann::json j = {
      {"id", rec.id},
      {"tier", rec.tier},
      {"posture", rec.posture},
      {"agent_id", rec.agent_id},
      {"runner_pid", rec.runner_pid},
      {"runner_starttime", rec.runner_starttime},
      {"pid", rec.pid},
      {"started_unix_ms", rec.started_unix_ms},
      {"state_dir", rec.state_dir},
      {"metrics_addr", rec.metrics_addr},
      {"container", rec.container},
      {"netns", rec.netns},
      {"veth", rec.veth},
      {"sam_box_pid", rec.sam_box_pid},
      {"egress_armed_in_guest", rec.egress_armed_in_guest},
      {"command", recordedCommand(rec.command)},
  };
  // Bytes that are not UTF-8 (an argument is any bytes) become U+FFFD instead of an error
  // that would stop the start: the command here is for reading.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

AgentRecord parseRecord(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw RunnerError(std::string("agent.json: not JSON: ") + e.what());
  }
  if (!j.is_object()) throw RunnerError("agent.json: not a JSON object");
  AgentRecord rec;
  rec.id = field<std::string>(j, "id", true);
  rec.tier = field<std::string>(j, "tier", true);
  rec.posture = field<std::string>(j, "posture", true);
  rec.agent_id = field<std::string>(j, "agent_id", false);
  rec.runner_pid = field<pid_t>(j, "runner_pid", true);
  rec.runner_starttime = field<uint64_t>(j, "runner_starttime", true);
  rec.pid = field<pid_t>(j, "pid", false, -1);
  rec.started_unix_ms = field<int64_t>(j, "started_unix_ms", false);
  rec.state_dir = field<std::string>(j, "state_dir", true);
  rec.metrics_addr = field<std::string>(j, "metrics_addr", false);
  rec.container = field<std::string>(j, "container", false);
  rec.netns = field<std::string>(j, "netns", false);
  rec.veth = field<std::string>(j, "veth", false);
  rec.sam_box_pid = field<int>(j, "sam_box_pid", false, -1);
  rec.egress_armed_in_guest = field<bool>(j, "egress_armed_in_guest", false, false);
  rec.command = field<std::vector<std::string>>(j, "command", false);
  if (!isAgentId(rec.id)) throw RunnerError("agent.json: \"id\" is not an agent id");
  return rec;
}

void writeRecord(const AgentRecord& rec) {
  const std::string final_path = rec.state_dir + "/" + kRecordFile;
  const std::string tmp_path = final_path + ".tmp";
  const std::string text = recordText(rec);
  {
    common::UniqueFd fd(
        ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid()) throw RunnerError("writing " + tmp_path + ": " + errnoText(errno));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw RunnerError("writing " + tmp_path + ": " + errnoText(errno));
      }
      done += static_cast<size_t>(n);
    }
  }
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    throw RunnerError("renaming " + tmp_path + ": " + errnoText(errno));
  }
}

void ensurePrivateDir(const std::string& dir, const std::string& what) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw RunnerError(what + ": mkdir(" + dir + "): " + errnoText(errno));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 022) != 0) {
    throw RunnerError(what + ": " + dir +
                      " must be a directory owned by the runner's user and not writable by "
                      "others");
  }
}

void writeFileAtomically(const std::string& path, std::string_view text, mode_t mode,
                         const std::string& what) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  common::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd.valid()) throw RunnerError(what + ": open(" + tmp + "): " + errnoText(errno));
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fchmod(fd.get(), mode) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw RunnerError(what + ": write(" + tmp + "): " + errnoText(err));
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw RunnerError(what + ": rename(" + tmp + ", " + path + "): " + errnoText(err));
  }
}

bool hasRecordFile(const std::string& dir) {
  struct stat st {};
  return ::lstat((dir + "/" + kRecordFile).c_str(), &st) == 0;
}

std::optional<AgentRecord> readRecord(const std::string& dir) {
  const std::string text = readSmallFile(dir + "/" + kRecordFile, kMaxRecordBytes);
  if (text.empty()) return std::nullopt;
  try {
    return parseRecord(text);
  } catch (const RunnerError&) {
    return std::nullopt;
  }
}

std::vector<AgentRecord> readRecords(std::vector<std::string>* unreadable) {
  std::vector<AgentRecord> out;
  std::vector<std::string> roots = {stateRoot("host"), stateRoot("podman")};
  if (roots[0] == roots[1]) roots.pop_back();
  for (const auto& root : roots) {
    // A root owned by another user is theirs: not this caller's agents. Root may look (and
    // `stop` then signals only a runner of the root's owner); host-tier records are never
    // asked for metrics (below), so a forged one cannot make the roster connect anywhere.
    struct stat root_st {};
    if (::lstat(root.c_str(), &root_st) != 0 || !S_ISDIR(root_st.st_mode) ||
        (root_st.st_uid != ::geteuid() && ::geteuid() != 0)) {
      continue;
    }
    DIR* dir = ::opendir(root.c_str());
    if (dir == nullptr) continue;
    std::vector<std::string> ids;
    while (const dirent* e = ::readdir(dir)) {
      if (isAgentId(e->d_name)) ids.emplace_back(e->d_name);
    }
    ::closedir(dir);
    const bool host_root = root == roots.front();
    for (const auto& id : ids) {
      const std::string dir = std::string(root).append("/").append(id);
      auto rec = readRecord(dir);
      // Where a record lies is what it is: a host-tier agent can edit its own agent.json, so
      // its claims about its id, directory or tier are not taken from the file.
      if (!rec || rec->id != id || (host_root && rec->tier != "host")) {
        if (unreadable != nullptr && hasRecordFile(dir)) unreadable->push_back(dir);
        continue;
      }
      rec->state_dir = dir;
      if (host_root) rec->metrics_addr.clear();  // the host tier has no sam-box to ask
      out.push_back(std::move(*rec));
    }
  }
  return out;
}

uint64_t processStartTime(pid_t pid) {
  if (pid <= 0) return 0;
  const std::string text = readSmallFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last
  // ')'. Field 3 is the state, field 22 the start time.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 1));
  std::string state;
  rest >> state;
  if (state == "Z" || state == "X") return 0;
  std::string skip;
  for (int f = 4; f < 22; ++f) rest >> skip;
  uint64_t start = 0;
  rest >> start;
  return rest ? start : 0;
}

bool runnerAlive(const AgentRecord& rec) {
  if (rec.runner_pid <= 0) return false;
  if (::kill(rec.runner_pid, 0) != 0 && errno == ESRCH) return false;
  const uint64_t start = processStartTime(rec.runner_pid);
  return start != 0 && start == rec.runner_starttime;
}

void removeStateDir(const std::string& path) {
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string last = dir.substr(dir.find_last_of('/') + 1);
  if (dir.empty() || dir.front() != '/' || dir == "/" || last == "." || last == "..") {
    throw RunnerError("refusing to remove state dir \"" + path + "\"");
  }
  const size_t slash = dir.find_last_of('/');
  const std::string parent = slash == 0 ? "/" : dir.substr(0, slash);
  const std::string name = dir.substr(slash + 1);
  // The state root is never a symlink (createStateDir() refuses one): one swapped in since
  // is not followed.
  common::UniqueFd parent_fd(
      ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!parent_fd.valid()) {
    if (errno == ENOENT) return;
    throw RunnerError("removing " + dir + ": " + errnoText(errno));
  }
  removeAt(parent_fd.get(), name, dir, 0);
}

}  // namespace runner
