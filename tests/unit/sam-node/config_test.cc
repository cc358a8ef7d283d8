#include "sam-node/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace samnode {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The example of docs/sam-node.md, "Configuration".
constexpr const char* kDocExample = R"(version: v1
services:
  - name: chat
    type: openai
    target_url: http://127.0.0.1:8001/v1/
    api_key: env://OPENAI_API_KEY
  - name: fs
    type: mcp
    target_url: http://127.0.0.1:8002/mcp
  - name: code-reviewer
    type: a2a
    target_url: http://127.0.0.1:7080
secrets:
  - name: github-token
    ref: file:///etc/sam/github-token
    header: Authorization
    format: "Bearer {}"
spawn:
  - name: reviewer
    bundle: /etc/sam/bundles/reviewer.yaml
    backend: podman
    command: [python3, /app/review.py]
runner: /usr/local/bin/compass-runner
probe_interval_ms: 250
upstream_idle_timeout_ms: 600000
allow_destinations: [127.0.0.1/32]
roles:
  - name: researchers
    allowed_agents: [researcher-1.prod.acme.example, "*.c1.acme.example"]
    services: [chat, fs, code-reviewer]
    tools: ["fs/read_file", "fs/*"]
    spawn: [reviewer]
    secrets:
      - name: github-token
        destinations: [api.github.com, "*.githubusercontent.com:443"]
)";

std::string refusal(const std::string& yaml) {
  try {
    parseConfig(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted:\n" << yaml;
  return "";
}

// The doc example with `from` replaced by `to` (must occur).
std::string edited(const std::string& from, const std::string& to) {
  std::string text = kDocExample;
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(ConfigTest, ParsesTheDocumentedExample) {
  const Config c = parseConfig(kDocExample);
  ASSERT_EQ(c.services.size(), 3u);
  EXPECT_EQ(c.services[0].name, "chat");
  EXPECT_EQ(c.services[0].type, ServiceType::kOpenai);
  EXPECT_EQ(c.services[0].target_url, "http://127.0.0.1:8001/v1");  // trailing '/' dropped
  EXPECT_EQ(c.services[0].api_key, "env://OPENAI_API_KEY");
  EXPECT_EQ(c.services[2].type, ServiceType::kA2a);
  EXPECT_EQ(serviceTypeName(c.services[1].type), "mcp");
  ASSERT_NE(c.secret("github-token"), nullptr);
  EXPECT_EQ(c.secret("github-token")->format, "Bearer {}");
  ASSERT_NE(c.spawnTemplate("reviewer"), nullptr);
  EXPECT_EQ(c.spawnTemplate("reviewer")->command.size(), 2u);
  EXPECT_EQ(c.runner, "/usr/local/bin/compass-runner");
  EXPECT_EQ(c.probe_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(c.upstream_idle_timeout, std::chrono::milliseconds(600000));
  ASSERT_EQ(c.destinations.allowed().size(), 1u);
  EXPECT_TRUE(c.destinations.permits(asio::ip::make_address("127.0.0.1")));
  EXPECT_FALSE(c.destinations.permits(asio::ip::make_address("127.0.0.2")));
  ASSERT_EQ(c.roles.size(), 1u);
  const Role& r = c.roles[0];
  ASSERT_EQ(r.allowed_agents.size(), 2u);
  EXPECT_FALSE(r.allowed_agents[0].wildcard);
  EXPECT_TRUE(r.allowed_agents[1].wildcard);
  EXPECT_EQ(r.allowed_agents[1].name, "c1.acme.example");
  ASSERT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.tools[0].service, "fs");
  EXPECT_EQ(r.tools[0].tool, "read_file");
  EXPECT_EQ(r.tools[1].tool, "*");
  ASSERT_EQ(r.secrets.size(), 1u);
  EXPECT_TRUE(r.secrets[0].destinations.allows("api.github.com", 443));
  EXPECT_TRUE(r.secrets[0].destinations.allows("raw.githubusercontent.com", 443));
  EXPECT_FALSE(r.secrets[0].destinations.allows("raw.githubusercontent.com", 80));
}

TEST(ConfigTest, DefaultsOfAMinimalFile) {
  const Config c = parseConfig("version: v1\n");
  EXPECT_TRUE(c.services.empty());
  EXPECT_EQ(c.runner, "compass-runner");
  EXPECT_EQ(c.probe_interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(c.upstream_idle_timeout, std::chrono::minutes(10));
  // No exception by default: loopback and the metadata address stay forbidden to secret-use.
  EXPECT_TRUE(c.destinations.allowed().empty());
  EXPECT_FALSE(c.destinations.permits(asio::ip::make_address("127.0.0.1")));
  EXPECT_FALSE(c.destinations.permits(asio::ip::make_address("169.254.169.254")));
  const Config d = parseConfig("version: v1\nsecrets:\n  - name: k\n    ref: k\n");
  EXPECT_EQ(d.secrets[0].header, "Authorization");
  EXPECT_EQ(d.secrets[0].format, "Bearer {}");
  EXPECT_FALSE(d.secrets[0].allow_http);  // secret-use sends secrets over https:// only
}

TEST(ConfigTest, AllowHttpIsAStrictBoolean) {
  const std::string base = "version: v1\nsecrets:\n  - name: k\n    ref: k\n    allow_http: ";
  EXPECT_TRUE(parseConfig(base + "true\n").secrets[0].allow_http);
  EXPECT_FALSE(parseConfig(base + "false\n").secrets[0].allow_http);
  // yaml-cpp alone would read these as booleans; a security switch takes only true/false.
  for (const char* value : {"yes", "on", "1", "\"true\"", "[true]", "TRUE", ""}) {
    SCOPED_TRACE(value);
    EXPECT_THAT(refusal(base + value + "\n"),
                StartsWith("secrets[0].allow_http: must be true or false"));
  }
}

TEST(ConfigTest, RefusalsNameTheField) {
  struct Case {
    std::string yaml, prefix, detail;
  };
  const std::vector<Case> cases = {
      {"", "config", "mapping"},
      {"version: v2\n", "version", "must be v1"},
      {"services: []\n", "version", "required"},
      {edited("runner:", "colour: blue\nrunner:"), "colour", "unknown key"},
      {edited("    api_key: env://OPENAI_API_KEY", "    api_key: env://K\n    color: x"),
       "services[0].color", "unknown key"},
      {edited("name: fs", "name: chat"), "services[1].name", "duplicate"},
      {edited("name: fs", "name: Fs_1"), "services[1].name", "RFC 1123"},
      {edited("type: mcp", "type: grpc"), "services[1].type", "openai, mcp or a2a"},
      {edited("http://127.0.0.1:8002/mcp", "ftp://127.0.0.1/x"), "services[1].target_url",
       "http://"},
      {edited("http://127.0.0.1:8002/mcp", "http://"), "services[1].target_url", "http://"},
      {edited("http://127.0.0.1:8002/mcp", "127.0.0.1:8002"), "services[1].target_url", "http://"},
      // libcurl would read the path as the host ("v1").
      {edited("http://127.0.0.1:8002/mcp", "http:///v1"), "services[1].target_url", "host"},
      {edited("http://127.0.0.1:8002/mcp", "http://127.0.0.1:99999/v1"), "services[1].target_url",
       "1..65535"},
      {edited("http://127.0.0.1:8002/mcp", "http://h/x?q=1"), "services[1].target_url", "query"},
      {edited("    target_url: http://127.0.0.1:7080", "    target_url: http://h\n    api_key: k"),
       "services[2].api_key", "only an openai"},
      {edited("format: \"Bearer {}\"", "format: \"Bearer\""), "secrets[0].format", "{}"},
      {edited("format: \"Bearer {}\"", "format: \"{} {}\""), "secrets[0].format", "{}"},
      {edited("header: Authorization", "header: \"Bad Header\""), "secrets[0].header",
       "field name"},
      {edited("bundle: /etc", "bundle: etc"), "spawn[0].bundle", "absolute"},
      {edited("command: [python3, /app/review.py]", "command: []"), "spawn[0].command", "empty"},
      {edited("probe_interval_ms: 250", "probe_interval_ms: 50"), "probe_interval_ms",
       "100 to 60000"},
      {edited("probe_interval_ms: 250", "probe_interval_ms: soon"), "probe_interval_ms",
       "100 to 60000"},
      {edited("upstream_idle_timeout_ms: 600000", "upstream_idle_timeout_ms: 999"),
       "upstream_idle_timeout_ms", "1000 to 3600000"},
      {edited("upstream_idle_timeout_ms: 600000", "upstream_idle_timeout_ms: 1h"),
       "upstream_idle_timeout_ms", "1000 to 3600000"},
      {edited("services: [chat, fs, code-reviewer]", "services: [chat, nope]"),
       "roles[0].services[1]", "no service named \"nope\""},
      {edited("\"fs/read_file\"", "\"git/log\""), "roles[0].tools[0]", "no service named"},
      {edited("\"fs/read_file\"", "\"chat/x\""), "roles[0].tools[0]", "not an mcp service"},
      {edited("\"fs/read_file\"", "\"fs\""), "roles[0].tools[0]", "<service>/<tool>"},
      {edited("spawn: [reviewer]", "spawn: [writer]"), "roles[0].spawn[0]", "no spawn template"},
      // Grants that would load but grant nothing, or not what they appear to.
      {edited("\"fs/read_file\"", "\"fs/read*\""), "roles[0].tools[0]", "one exact name"},
      {edited("\"fs/read_file\"", "\"fs/*_file\""), "roles[0].tools[0]", "one exact name"},
      {edited("\"fs/read_file\"", "\"fs/read file\""), "roles[0].tools[0]", "no spaces"},
      {edited("services: [chat, fs, code-reviewer]", "services: [chat, code-reviewer]"),
       "roles[0].tools[0]", "\"fs\" is not in this role's services"},
      {edited("allowed_agents: [researcher-1.prod.acme.example, \"*.c1.acme.example\"]",
              "allowed_agents: []"),
       "roles[0].allowed_agents", "at least one agent"},
      {edited("    allowed_agents: [researcher-1.prod.acme.example, \"*.c1.acme.example\"]\n", ""),
       "roles[0].allowed_agents", "grants nothing"},
      {edited("backend: podman", "backend: docker"), "spawn[0].backend", "podman, microvm or host"},
      {edited("backend: podman", "backend: apple-container"), "spawn[0].backend",
       "got \"apple-container\""},
      {edited("backend: podman", "backend: Podman"), "spawn[0].backend", "podman, microvm"},
      {edited("      - name: github-token\n        dest", "      - name: gitlab\n        dest"),
       "roles[0].secrets[0].name", "no secret named"},
      {edited("api.github.com,", "10.0.0.1,"), "roles[0].secrets[0].destinations[0]", "10.0.0.1"},
      {edited("\"*.c1.acme.example\"", "\"a.*.example\""), "roles[0].allowed_agents[1]",
       "agent id"},
      {edited("\"*.c1.acme.example\"", "\"*\""), "roles[0].allowed_agents[1]", "agent id"},
      {"version: v1\nversion: v1\n", "version", "duplicate key"},
      {"version: [v1\n", "config", "not valid YAML"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    const std::string error = refusal(c.yaml);
    EXPECT_THAT(error, StartsWith(c.prefix));
    EXPECT_THAT(error, HasSubstr(c.detail));
  }
}

TEST(ConfigTest, RefusalsSayWhereInTheFile) {
  // The field's own value, a key nobody knows, an element of a sequence, and a required key's
  // mapping (the key is not there to point at).
  EXPECT_THAT(refusal("version: v1\nservices:\n  - name: m\n    type: grpc\n"),
              EndsWith("(line 4, column 11)"));
  EXPECT_THAT(refusal("version: v1\nservices:\n  - name: m\n    type: openai\n"
                      "    target_url: http://h\n    colour: red\n"),
              EndsWith("services[0].colour: unknown key (line 6, column 13)"));
  EXPECT_THAT(refusal("version: v1\nallow_destinations: [10.0.0.0/8, 127.0.0.0/33]\n"),
              EndsWith("(line 2, column 34)"));
  EXPECT_THAT(refusal("version: v1\nservices:\n  - name: m\n    type: openai\n"),
              StartsWith("services[0].target_url: is required (line 3, column 5)"));
  // A file that is no YAML mapping has no field to point at: said once, no place.
  EXPECT_THAT(refusal(""), Not(HasSubstr("line")));
}

TEST(ConfigTest, AllowDestinationsTakesCidrsLikeSamBox) {
  const Config c =
      parseConfig("version: v1\nallow_destinations: [127.0.0.0/8, \"::1\", 169.254.169.254]\n");
  ASSERT_EQ(c.destinations.allowed().size(), 3u);
  EXPECT_EQ(c.destinations.allowed()[1].text(), "::1/128");  // a bare address is one host
  EXPECT_TRUE(c.destinations.permits(asio::ip::make_address("127.9.9.9")));
  EXPECT_TRUE(c.destinations.permits(asio::ip::make_address("::ffff:127.0.0.1")));  // mapped
  EXPECT_TRUE(c.destinations.permits(asio::ip::make_address("169.254.169.254")));
  EXPECT_FALSE(c.destinations.permits(asio::ip::make_address("169.254.169.253")));
  EXPECT_TRUE(parseConfig("version: v1\nallow_destinations: []\n").destinations.allowed().empty());

  struct Case {
    std::string value, prefix, detail;
  };
  const std::vector<Case> cases = {
      {"127.0.0.1/8", "allow_destinations[0]: \"127.0.0.1/8\"", "host bits"},
      {"localhost", "allow_destinations[0]: \"localhost\"", "not an IP address"},
      {"10.0.0.0/33", "allow_destinations[0]", "out of range"},
      {"\"fe80::1%eth0\"", "allow_destinations[0]", "zone"},
      {"\"\"", "allow_destinations[0]", "must not be empty"},
      {"[a, b]", "allow_destinations[0]", "must be a string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.value);
    const std::string error = refusal("version: v1\nallow_destinations: [" + c.value + "]\n");
    EXPECT_THAT(error, StartsWith(c.prefix));
    EXPECT_THAT(error, HasSubstr(c.detail));
  }
  EXPECT_THAT(refusal("version: v1\nallow_destinations: 127.0.0.0/8\n"),
              StartsWith("allow_destinations: must be a sequence"));
  EXPECT_THAT(refusal("version: v1\nallow_destinations: [10.0.0.0/8, 127.0.0.0/33]\n"),
              StartsWith("allow_destinations[1]"));
}

TEST(ConfigTest, DuplicateRoleNames) {
  const std::string yaml =
      "version: v1\nroles:\n  - name: a\n    allowed_agents: [x.example]\n  - name: a\n    "
      "allowed_agents: [y.example]\n";
  EXPECT_THAT(refusal(yaml), StartsWith("roles[1].name: duplicate name"));
}

TEST(ConfigTest, LoadConfigNamesAnUnreadableFile) {
  try {
    loadConfig("/nonexistent/sam-node.yaml");
    FAIL() << "loaded a missing file";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot read /nonexistent/sam-node.yaml"));
  }
  const auto path = std::filesystem::temp_directory_path() / "sam-node-config-test.yaml";
  std::ofstream(path) << kDocExample;
  EXPECT_EQ(loadConfig(path).services.size(), 3u);
  std::filesystem::remove(path);
}

TEST(ConfigTest, AgentPatternsMatchLikeEgressWildcards) {
  const AgentPattern exact{false, "researcher-1.prod.acme.example"};
  const AgentPattern ns{true, "c1.acme.example"};
  EXPECT_TRUE(agentMatches(exact, "researcher-1.prod.acme.example"));
  EXPECT_FALSE(agentMatches(exact, "x.researcher-1.prod.acme.example"));
  EXPECT_TRUE(agentMatches(ns, "a.c1.acme.example"));
  EXPECT_TRUE(agentMatches(ns, "x.y.c1.acme.example"));
  EXPECT_FALSE(agentMatches(ns, "c1.acme.example"));
  EXPECT_FALSE(agentMatches(ns, "evilc1.acme.example"));
  EXPECT_FALSE(agentMatches(ns, ".c1.acme.example"));
}

}  // namespace
}  // namespace samnode
