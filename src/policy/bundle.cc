#include "policy/bundle.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "policy/name.h"

namespace policy {
namespace {

// The schema is three collections deep (root → egress → allow); anything much deeper is
// refused while parsing, before yaml-cpp's own recursion can grow the stack.
constexpr size_t kMaxDepth = 8;
// Keys and values quoted back in errors are cut here: an error line is not a place to
// replay a hostile file.
constexpr size_t kMaxQuotedBytes = 64;

constexpr std::string_view kVersion = "v1";

// Our own small tree, built from parser events, instead of YAML::Node: yaml-cpp's node API
// silently merges duplicate keys and resolves aliases, and both must be refused.
struct Node {
  enum class Kind { kNull, kScalar, kSequence, kMap };
  Kind kind = Kind::kNull;
  bool quoted = false;  // written in quotes (or tagged "!"): a string, never a number
  std::string value;
  YAML::Mark mark;
  std::vector<Node> children;  // sequence items; for a map, key and value alternate
};

std::string at(const YAML::Mark& mark) {
  if (mark.is_null()) return "";
  return " (line " + std::to_string(mark.line + 1) + ", column " + std::to_string(mark.column + 1) +
         ")";
}

// Printable ASCII only, bounded, so an error message cannot carry control characters or
// megabytes of input into a log line.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kMaxQuotedBytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out.push_back(c >= 0x20 && c < 0x7f && c != '"' ? static_cast<char>(c) : '?');
  }
  if (text.size() > kMaxQuotedBytes) out += "...";
  return out + "\"";
}

std::string_view describe(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kNull:
      return "null";
    case Node::Kind::kScalar:
      return node.quoted ? "a quoted string" : "a scalar";
    case Node::Kind::kSequence:
      return "a sequence";
    case Node::Kind::kMap:
      return "a mapping";
  }
  return "unknown";
}

class TreeBuilder : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1) throw BundleError("", "more than one YAML document" + at(mark));
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    refuseAnchor(mark, anchor);
    add(Node{Node::Kind::kNull, false, {}, mark, {}});
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override {
    throw BundleError("", "YAML aliases are not allowed" + at(mark));
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    refuseAnchor(mark, anchor);
    refuseTag(mark, tag);
    add(Node{Node::Kind::kScalar, tag == "!", value, mark, {}});
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value /*style*/) override {
    open(Node::Kind::kSequence, mark, tag, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value /*style*/) override {
    open(Node::Kind::kMap, mark, tag, anchor);
  }
  void OnMapEnd() override { close(); }
  void OnAnchor(const YAML::Mark& mark, const std::string& /*name*/) override {
    throw BundleError("", "YAML anchors are not allowed" + at(mark));
  }

  [[nodiscard]] bool empty() const { return documents_ == 0; }
  Node takeRoot() { return std::move(root_); }

 private:
  static void refuseAnchor(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor)
      throw BundleError("", "YAML anchors are not allowed" + at(mark));
  }
  // "?" and "!" are the parser's non-specific tags; anything else ("!!int", "!foo") asks
  // for a type the schema already fixes.
  static void refuseTag(const YAML::Mark& mark, const std::string& tag) {
    if (tag != "?" && tag != "!") throw BundleError("", "YAML tags are not allowed" + at(mark));
  }
  void open(Node::Kind kind, const YAML::Mark& mark, const std::string& tag,
            YAML::anchor_t anchor) {
    refuseAnchor(mark, anchor);
    refuseTag(mark, tag);
    if (stack_.size() >= kMaxDepth) {
      throw BundleError("",
                        "nested deeper than " + std::to_string(kMaxDepth) + " levels" + at(mark));
    }
    stack_.push_back(Node{kind, false, {}, mark, {}});
  }
  void close() {
    Node done = std::move(stack_.back());
    stack_.pop_back();
    add(std::move(done));
  }
  void add(Node node) {
    if (stack_.empty()) {
      root_ = std::move(node);
    } else {
      stack_.back().children.push_back(std::move(node));
    }
  }

  int documents_ = 0;
  std::vector<Node> stack_;
  Node root_;
};

Node parseYaml(std::string_view text) {
  std::istringstream in{std::string(text)};
  TreeBuilder builder;
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(builder);
    // A second document throws from OnDocumentStart before its content is built.
    parser.HandleNextDocument(builder);
  } catch (const YAML::Exception& e) {
    throw BundleError("", "invalid YAML" + at(e.mark) + ": " + e.msg);
  }
  if (builder.empty()) throw BundleError("", "empty document");
  return builder.takeRoot();
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// A mapping's entries, keyed by string, with duplicate and non-string keys refused.
class Fields {
 public:
  Fields(const Node& node, std::string path) : path_(std::move(path)) {
    if (node.kind != Node::Kind::kMap) {
      throw BundleError(path_,
                        "expected a mapping, got " + std::string(describe(node)) + at(node.mark));
    }
    // A set, not find(): a hostile flow map can hold thousands of keys.
    std::set<std::string_view> seen;
    for (size_t i = 0; i + 1 < node.children.size(); i += 2) {
      const Node& key = node.children[i];
      if (key.kind != Node::Kind::kScalar) {
        throw BundleError(
            path_, "key is " + std::string(describe(key)) + ", expected a string" + at(key.mark));
      }
      if (!seen.insert(key.value).second) {
        throw BundleError(join(path_, quoteKey(key.value)), "duplicate key" + at(key.mark));
      }
      entries_.emplace_back(&key, &node.children[i + 1]);
    }
  }

  // Unknown keys are refused so that a typo ("egres") cannot silently drop a rule.
  void refuseUnknown(std::initializer_list<std::string_view> known) const {
    for (const auto& [key, value] : entries_) {
      if (std::find(known.begin(), known.end(), key->value) == known.end()) {
        throw BundleError(join(path_, quoteKey(key->value)), "unknown key" + at(key->mark));
      }
    }
  }

  [[nodiscard]] const Node* find(std::string_view key) const {
    for (const auto& [k, value] : entries_) {
      if (k->value == key) return value;
    }
    return nullptr;
  }

  const Node& require(std::string_view key, const Node& parent) const {
    const Node* value = find(key);
    if (value == nullptr) throw BundleError(join(path_, key), "required" + at(parent.mark));
    return *value;
  }

 private:
  // Keys are echoed into the field path; a hostile key must not smuggle bytes into logs.
  static std::string quoteKey(std::string_view key) {
    const bool plain = !key.empty() && key.size() <= kMaxQuotedBytes &&
                       std::all_of(key.begin(), key.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                (c >= '0' && c <= '9') || c == '_' || c == '-';
                       });
    return plain ? std::string(key) : quote(key);
  }

  std::string path_;
  std::vector<std::pair<const Node*, const Node*>> entries_;
};

const std::string& readString(const Node& node, const std::string& path) {
  if (node.kind != Node::Kind::kScalar) {
    throw BundleError(path,
                      "expected a string, got " + std::string(describe(node)) + at(node.mark));
  }
  return node.value;
}

std::string readName(const Node& node, const std::string& path) {
  const std::string& raw = readString(node, path);
  std::string reason;
  auto name = normalizeName(raw, &reason);
  if (!name) throw BundleError(path, reason + ": " + quote(raw) + at(node.mark));
  return std::move(*name);
}

uint16_t readPort(const Node& node, const std::string& path) {
  // Only a plain decimal integer: YAML 1.1 readers would take "0o17", "0x1f" or "1_000" as
  // numbers too, and a quoted "8080" is a string by the schema's own rules.
  if (node.kind != Node::Kind::kScalar || node.quoted) {
    throw BundleError(path,
                      "expected an integer, got " + std::string(describe(node)) + at(node.mark));
  }
  const std::string& text = node.value;
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(),
                                                   [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    throw BundleError(path, "expected an integer, got " + quote(text) + at(node.mark));
  }
  if (text.size() > 1 && text.front() == '0') {
    throw BundleError(path, "port has leading zeros" + at(node.mark));
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1 || value > 65535) {
    throw BundleError(path, "port out of range 1..65535: " + quote(text) + at(node.mark));
  }
  return static_cast<uint16_t>(value);
}

std::string readExternalId(const Node& node, const std::string& path) {
  const std::string& id = readString(node, path);
  if (id.empty()) throw BundleError(path, "empty" + at(node.mark));
  if (id.size() > kMaxExternalIdBytes) {
    throw BundleError(
        path, "longer than " + std::to_string(kMaxExternalIdBytes) + " bytes" + at(node.mark));
  }
  const bool printable = std::all_of(id.begin(), id.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x21 && u <= 0x7e;
  });
  if (!printable) {
    throw BundleError(path, "not printable ASCII without spaces" + at(node.mark));
  }
  return id;
}

std::vector<AllowRule> readAllow(const Node& node, const std::string& path) {
  if (node.kind != Node::Kind::kSequence) {
    throw BundleError(path,
                      "expected a sequence, got " + std::string(describe(node)) + at(node.mark));
  }
  if (node.children.size() > kMaxAllowEntries) {
    throw BundleError(path,
                      "more than " + std::to_string(kMaxAllowEntries) + " entries" + at(node.mark));
  }
  std::vector<AllowRule> rules;
  rules.reserve(node.children.size());
  for (size_t i = 0; i < node.children.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    const Node& item = node.children[i];
    const std::string& entry = readString(item, item_path);
    try {
      rules.push_back(parseAllowRule(entry));
    } catch (const AllowRuleError& e) {
      throw BundleError(item_path, e.what() + (": " + quote(entry)) + at(item.mark));
    }
  }
  return rules;
}

Bundle readBundle(const Node& root) {
  if (root.kind == Node::Kind::kNull) throw BundleError("", "empty document");
  const Fields top(root, "");
  // The version is read before anything else: under another version, other keys mean
  // other things, and "unsupported version" is the error an operator needs.
  const Node& version = top.require("version", root);
  if (version.kind != Node::Kind::kScalar || version.value != kVersion) {
    const std::string got =
        version.kind == Node::Kind::kScalar ? quote(version.value) : std::string(describe(version));
    throw BundleError("version",
                      "unsupported version " + got + ", expected \"v1\"" + at(version.mark));
  }
  top.refuseUnknown({"version", "agent", "egress", "serves"});

  Bundle bundle;
  const Node& agent = top.require("agent", root);
  const Fields agent_fields(agent, "agent");
  agent_fields.refuseUnknown({"id", "external_id"});
  bundle.agent_id = readName(agent_fields.require("id", agent), "agent.id");
  if (const Node* external = agent_fields.find("external_id")) {
    bundle.external_id = readExternalId(*external, "agent.external_id");
  }

  if (const Node* egress = top.find("egress")) {
    const Fields egress_fields(*egress, "egress");
    egress_fields.refuseUnknown({"allow"});
    if (const Node* allow = egress_fields.find("allow")) {
      bundle.egress_allow = readAllow(*allow, "egress.allow");
    }
  }

  if (const Node* serves = top.find("serves")) {
    const Fields serves_fields(*serves, "serves");
    serves_fields.refuseUnknown({"name", "port"});
    Serves out;
    out.name = readName(serves_fields.require("name", *serves), "serves.name");
    out.port = readPort(serves_fields.require("port", *serves), "serves.port");
    bundle.serves = std::move(out);
  }
  return bundle;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

Bundle parseBundle(std::string_view yaml_text) {
  if (yaml_text.size() > kMaxBundleBytes) {
    throw BundleError("", "bundle larger than " + std::to_string(kMaxBundleBytes) + " bytes");
  }
  return readBundle(parseYaml(yaml_text));
}

Bundle loadBundle(const std::filesystem::path& path) {
  const auto fail = [&](int err) {
    throw BundleError(
        "", "cannot read bundle " + path.string() + ": " + std::generic_category().message(err));
  };
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rbe"));
  if (!file) fail(errno);
  // One byte past the limit is enough to know the file is too large, whatever its size
  // claims (a FIFO or /proc file has none).
  std::string text(kMaxBundleBytes + 1, '\0');
  const size_t got = std::fread(text.data(), 1, text.size(), file.get());
  if (std::ferror(file.get())) fail(errno != 0 ? errno : EIO);
  if (got > kMaxBundleBytes) {
    throw BundleError("", "bundle " + path.string() + " larger than " +
                              std::to_string(kMaxBundleBytes) + " bytes");
  }
  text.resize(got);
  return parseBundle(text);
}

}  // namespace policy
