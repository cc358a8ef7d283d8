#include "compass-runner/podman_conf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/state.h"

namespace runner::podman {

const char* const kContainersConf =
    R"(# Written by compass-runner; every podman call it makes reads only this file
# (CONTAINERS_CONF). Rewritten at each start: edits here do not last.

[containers]
# Root on this host lacks CAP_SYS_RESOURCE: podman's default ulimits cannot be set.
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
# A fork bomb in one agent must not exhaust the host's pids (--pids overrides).
pids_limit = 2048
log_driver = "k8s-file"

[engine]
# crun fails on this host's hybrid cgroup layout; runc works.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
)";

std::string containersConfPath() { return stateRoot("podman") + "/containers.conf"; }

void writeContainersConf(const std::string& path) {
  {
    std::ifstream in(path);
    std::stringstream have;
    have << in.rdbuf();
    if (in && have.str() == kContainersConf) return;
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  // The state root itself 0700, as createStateDir() would make it (state.h).
  std::filesystem::create_directories(dir.parent_path(), ec);
  if (ec || (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)) {
    throw RunnerError("containers.conf: mkdir " + dir.string() + ": " +
                      (ec ? ec.message() : std::strerror(errno)));
  }
  writeFileAtomically(path, kContainersConf, 0644, "containers.conf");
}

// ---------------------------------------------------------------------------------------
// TOML subset

namespace {

class TomlReader {
 public:
  explicit TomlReader(const ConfFile& file) : file_(file), s_(file.text) {}

  TomlValues parse() {
    TomlValues out;
    std::string table;
    while (true) {
      skipBlank(/*newlines=*/true);
      if (atEnd()) break;
      if (peek() == '[') {
        table = header();
      } else {
        std::string key = readKey();
        std::vector<std::string> value;
        readValue(value);
        out[table.empty() ? key : table + "." + key] = std::move(value);
      }
      endOfLine();
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw RunnerError(file_.path + ":" + std::to_string(line_) + ": " + why);
  }
  [[nodiscard]] bool atEnd() const { return pos_ >= s_.size(); }
  [[nodiscard]] char peek() const { return atEnd() ? '\0' : s_[pos_]; }
  char next() {
    const char c = s_[pos_++];
    if (c == '\n') ++line_;
    return c;
  }

  // Spaces, tabs, comments; newlines too when `newlines`.
  void skipBlank(bool newlines) {
    while (!atEnd()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        next();
      } else if (c == '#') {
        while (!atEnd() && peek() != '\n') next();
      } else {
        break;
      }
    }
  }

  void endOfLine() {
    skipBlank(false);
    if (!atEnd() && peek() != '\n') fail("unexpected text after the value: " + restOfLine());
  }

  std::string restOfLine() const {
    const size_t end = s_.find('\n', pos_);
    return s_.substr(pos_, end == std::string::npos ? std::string::npos : end - pos_);
  }

  std::string header() {
    next();  // '['
    const bool array_of_tables = peek() == '[';
    if (array_of_tables) next();
    std::string name;
    while (!atEnd() && peek() != ']' && peek() != '\n') name += next();
    if (peek() != ']') fail("unterminated table header");
    next();
    if (array_of_tables) {
      if (peek() != ']') fail("unterminated [[table]] header");
      next();
    }
    name = trim(name);
    if (name.empty()) fail("empty table name");
    return name;
  }

  std::string readKey() {
    std::string key;
    if (peek() == '"' || peek() == '\'') {
      std::vector<std::string> v;
      readString(v);
      key = v.front();
    } else {
      while (!atEnd() && peek() != '=' && peek() != '\n' && peek() != '#') key += next();
      key = trim(key);
    }
    skipBlank(false);
    if (peek() != '=' || key.empty()) fail("expected `key = value`, got: " + restOfLine());
    next();
    skipBlank(false);
    return key;
  }

  void readValue(std::vector<std::string>& out) {
    const char c = peek();
    if (c == '"' || c == '\'') {
      readString(out);
    } else if (c == '[') {
      readArray(out);
    } else if (c == '{') {
      skipInlineTable();
    } else {
      std::string scalar;
      while (!atEnd()) {
        const char d = peek();
        if (d == ' ' || d == '\t' || d == '\r' || d == '\n' || d == ',' || d == ']' || d == '#') {
          break;
        }
        scalar += next();
      }
      if (scalar.empty()) fail("missing value");
      out.push_back(scalar);
    }
  }

  void readString(std::vector<std::string>& out) {
    const char quote = next();
    const bool multi = s_.compare(pos_, 2, std::string(2, quote)) == 0;
    if (multi) {
      next();
      next();
      if (peek() == '\n') next();  // TOML trims the newline right after the opening quotes
    }
    std::string value;
    while (true) {
      if (atEnd()) fail("unterminated string");
      if (multi && s_.compare(pos_, 3, std::string(3, quote)) == 0) {
        pos_ += 3;
        break;
      }
      const char c = next();
      if (!multi && c == '\n') fail("unterminated string");
      if (!multi && c == quote) break;
      if (c == '\\' && quote == '"') {
        if (atEnd()) fail("unterminated string");
        const char e = next();
        switch (e) {
          case 'n':
            value += '\n';
            break;
          case 't':
            value += '\t';
            break;
          case 'r':
            value += '\r';
            break;
          default:
            value += e;
            break;  // \" \\ and (kept verbatim) \uXXXX's letters
        }
        continue;
      }
      value += c;
    }
    out.push_back(std::move(value));
  }

  void readArray(std::vector<std::string>& out) {
    const size_t start_line = line_;
    next();  // '['
    while (true) {
      skipBlank(true);
      if (atEnd()) {
        line_ = start_line;
        fail("unterminated array");
      }
      if (peek() == ']') {
        next();
        return;
      }
      readValue(out);
      skipBlank(true);
      if (peek() == ',') {
        next();
      } else if (peek() != ']') {
        fail("expected `,` or `]` in an array");
      }
    }
  }

  void skipInlineTable() {
    int depth = 0;
    while (!atEnd()) {
      const char c = peek();
      if (c == '"' || c == '\'') {
        std::vector<std::string> ignored;
        readString(ignored);
        continue;
      }
      if (c == '\n') fail("unterminated inline table");
      next();
      if (c == '{') ++depth;
      if (c == '}' && --depth == 0) return;
    }
    fail("unterminated inline table");
  }

  static std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\r");
    if (b == std::string::npos) return "";
    const size_t e = s.find_last_not_of(" \t\r");
    return s.substr(b, e - b + 1);
  }

  const ConfFile& file_;
  const std::string& s_;
  size_t pos_ = 0;
  size_t line_ = 1;
};

// pasta's short options that take an argument (pasta(1)): in a cluster, the rest of the
// element after one of these is its value, not more options.
constexpr std::string_view kShortWithArgument = "aglimnoDMPSp";
constexpr std::string_view kForwardShort = "tuTU";

bool isForwardLong(std::string_view name) {
  return name == "tcp-ports" || name == "udp-ports" || name == "tcp-ns" || name == "udp-ns";
}

std::string lastValue(const TomlValues& v, const std::string& key, bool* set) {
  auto it = v.find(key);
  if (it == v.end() || it->second.empty()) return "";
  *set = true;
  return it->second.back();
}

std::string joinQuoted(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "\"" : ", \"") + i + "\"";
  return "[" + out + "]";
}

}  // namespace

TomlValues parseToml(const ConfFile& file) { return TomlReader(file).parse(); }

bool pastaOptionsForward(const std::vector<std::string>& options) {
  std::vector<std::string> args;
  for (const auto& o : options) {
    std::istringstream words(o);
    for (std::string w; words >> w;) args.push_back(w);
  }
  // A forward option's value: attached, or the next element; "none" disables it.
  auto forwards = [&](size_t& i, std::string_view attached) {
    std::string value(attached);
    if (value.empty() && i + 1 < args.size()) value = args[++i];
    return value != "none";
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a.rfind("--", 0) == 0) {
      const std::string_view body = a.substr(2);
      const size_t eq = body.find('=');
      const std::string_view name = body.substr(0, eq);
      if (!isForwardLong(name)) continue;
      if (forwards(i, eq == std::string_view::npos ? "" : body.substr(eq + 1))) return true;
    } else if (a.size() > 1 && a[0] == '-') {
      for (size_t k = 1; k < a.size(); ++k) {
        if (kForwardShort.find(a[k]) != std::string_view::npos) {
          if (forwards(i, a.substr(k + 1))) return true;
          break;
        }
        if (kShortWithArgument.find(a[k]) != std::string_view::npos) break;
      }
    }
  }
  return false;
}

std::optional<std::string> pastaForwardRefusal(const std::vector<ConfFile>& files) {
  std::string rootless_cmd;  // last setting wins, as podman merges the files
  bool rootless_set = false;
  std::string netns, netns_from, cmd_path, cmd_path_from, rootless_from;
  std::vector<std::pair<std::string, std::vector<std::string>>> forwarding;
  for (const auto& f : files) {
    const TomlValues v = parseToml(f);
    bool set = false;
    const std::string r = lastValue(v, "network.default_rootless_network_cmd", &set);
    if (set) rootless_cmd = r, rootless_set = true, rootless_from = f.path;
    set = false;
    const std::string n = lastValue(v, "containers.netns", &set);
    if (set) netns = n, netns_from = f.path;
    set = false;
    const std::string p = lastValue(v, "engine.network_cmd_path", &set);
    if (set) cmd_path = p, cmd_path_from = f.path;
    // Every file's forwards count (not only the last): refusing a forward a later file would
    // have replaced is the fail-closed reading.
    auto it = v.find("network.pasta_options");
    if (it != v.end() && pastaOptionsForward(it->second))
      forwarding.emplace_back(f.path, it->second);
  }
  std::string why_pasta;
  if (!rootless_set) {
    why_pasta =
        "no file sets [network] default_rootless_network_cmd, and podman 5 defaults to pasta";
  } else if (rootless_cmd == "pasta") {
    why_pasta = rootless_from + " sets [network] default_rootless_network_cmd = \"pasta\"";
  } else if (netns.rfind("pasta", 0) == 0) {
    why_pasta = netns_from + " sets [containers] netns = \"" + netns + "\"";
  } else if (std::filesystem::path(cmd_path).filename() == "pasta") {
    why_pasta = cmd_path_from + " sets [engine] network_cmd_path = \"" + cmd_path + "\"";
  }
  if (why_pasta.empty() || forwarding.empty()) return std::nullopt;
  const auto& [path, options] = forwarding.front();
  return path + ": [network] pasta_options = " + joinQuoted(options) +
         " sets up a port forward (-T/-U/--tcp-ns/--udp-ns reach the host's loopback from the "
         "sandbox; -t/-u/--tcp-ports/--udp-ports expose it), and pasta is the agents' network (" +
         why_pasta + "). Remove the forward from pasta_options (seed 002, podman)";
}

std::vector<std::string> containersConfCandidates(const char* operator_conf,
                                                  const std::string& ours) {
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec) &&
        std::find(out.begin(), out.end(), p) == out.end()) {
      out.push_back(p);
    }
  };
  add("/usr/share/containers/containers.conf");
  add("/etc/containers/containers.conf");
  std::vector<std::string> dropins;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator("/etc/containers/containers.conf.d", ec)) {
    if (e.path().extension() == ".conf") dropins.push_back(e.path().string());
  }
  std::sort(dropins.begin(), dropins.end());
  for (const auto& d : dropins) add(d);
  if (operator_conf != nullptr && *operator_conf != '\0') add(operator_conf);
  add(ours);
  return out;
}

void verifyNoPastaForwards(const std::vector<std::string>& paths) {
  std::vector<ConfFile> files;
  for (const auto& p : paths) {
    std::ifstream in(p);
    if (!in) throw RunnerError("pasta check: cannot read " + p + ": " + std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    files.push_back({p, text.str()});
  }
  if (auto refusal = pastaForwardRefusal(files)) {
    throw RunnerError("refusing to start: " + *refusal);
  }
}

}  // namespace runner::podman
