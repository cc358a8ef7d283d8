#include "sam-node/grants.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace samnode {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr const char* kConfig = R"(version: v1
services:
  - {name: chat, type: openai, target_url: "http://127.0.0.1:1/v1"}
  - {name: fs, type: mcp, target_url: "http://127.0.0.1:2/mcp"}
  - {name: git, type: mcp, target_url: "http://127.0.0.1:3/mcp"}
secrets:
  - {name: token, ref: "env://TOKEN"}
spawn:
  - {name: reviewer, bundle: /b.yaml, backend: host, command: [true]}
roles:
  - name: researchers
    allowed_agents: [researcher-1.prod.acme.example]
    services: [chat, fs]
    tools: ["fs/read_file"]
  - name: cluster
    allowed_agents: ["*.c1.acme.example"]
    services: [fs, git]
    tools: ["fs/*", "git/log"]
    spawn: [reviewer]
    secrets:
      - {name: token, destinations: ["api.github.com:443", "*.githubusercontent.com"]}
)";

class GrantsTest : public ::testing::Test {
 protected:
  Config config = parseConfig(kConfig);
  Grants grants{config};
};

TEST_F(GrantsTest, RolesAreMatchedByIdAndNamespace) {
  EXPECT_THAT(grants.roles("researcher-1.prod.acme.example"), ElementsAre("researchers"));
  EXPECT_THAT(grants.roles("Researcher-1.Prod.Acme.Example."), ElementsAre("researchers"));
  EXPECT_THAT(grants.roles("a.c1.acme.example"), ElementsAre("cluster"));
  EXPECT_THAT(grants.roles("c1.acme.example"), IsEmpty());
  EXPECT_THAT(grants.roles(""), IsEmpty());
  EXPECT_THAT(grants.roles("not a name!"), IsEmpty());
}

TEST_F(GrantsTest, Services) {
  EXPECT_TRUE(grants.mayUseService("researcher-1.prod.acme.example", "chat"));
  EXPECT_FALSE(grants.mayUseService("researcher-1.prod.acme.example", "git"));
  EXPECT_FALSE(grants.mayUseService("a.c1.acme.example", "chat"));
  EXPECT_TRUE(grants.mayUseService("a.c1.acme.example", "git"));
  EXPECT_FALSE(grants.mayUseService("stranger.example", "fs"));
}

TEST_F(GrantsTest, ToolsNeedTheServiceAndAToolGrant) {
  const std::string r = "researcher-1.prod.acme.example";
  EXPECT_TRUE(grants.mayUseTool(r, "fs", "read_file"));
  EXPECT_FALSE(grants.mayUseTool(r, "fs", "write_file"));
  EXPECT_TRUE(grants.mayUseTool("b.c1.acme.example", "fs", "write_file"));
  EXPECT_TRUE(grants.mayUseTool("b.c1.acme.example", "git", "log"));
  EXPECT_FALSE(grants.mayUseTool("b.c1.acme.example", "git", "push"));
}

TEST_F(GrantsTest, SpawnAndSecrets) {
  EXPECT_TRUE(grants.maySpawn("a.c1.acme.example", "reviewer"));
  EXPECT_FALSE(grants.maySpawn("researcher-1.prod.acme.example", "reviewer"));
  EXPECT_TRUE(grants.mayUseSecret("a.c1.acme.example", "token", "api.github.com", 443));
  EXPECT_FALSE(grants.mayUseSecret("a.c1.acme.example", "token", "api.github.com", 80));
  EXPECT_TRUE(grants.mayUseSecret("a.c1.acme.example", "token", "raw.githubusercontent.com", 80));
  EXPECT_FALSE(grants.mayUseSecret("a.c1.acme.example", "token", "githubusercontent.com", 443));
  EXPECT_FALSE(
      grants.mayUseSecret("researcher-1.prod.acme.example", "token", "api.github.com", 443));
}

}  // namespace
}  // namespace samnode
