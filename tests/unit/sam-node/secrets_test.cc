// Secret providers (docs/sam-node.md, "Secret providers") with real files and variables; the
// keyring case runs without a session bus and must say so.

#include "sam-node/secrets.h"

#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace samnode {
namespace {

namespace fs = std::filesystem;

class SecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/secrets_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::create_directories(dir_ / "secrets");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }
  std::string errorOf(const SecretStore& store, const std::string& ref) {
    try {
      (void)store.read(ref);
    } catch (const SecretError& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(SecretsTest, FileDropsOneTrailingNewline) {
  write(dir_ / "a", "tok-123\n");
  write(dir_ / "b", "tok-456\n\n");
  write(dir_ / "c", "tok-789");
  SecretStore store(dir_.string(), "file");
  EXPECT_EQ(store.read("file://" + (dir_ / "a").string()), "tok-123");
  EXPECT_EQ(store.read("file://" + (dir_ / "b").string()), "tok-456\n");
  EXPECT_EQ(store.read("file://" + (dir_ / "c").string()), "tok-789");
}

TEST_F(SecretsTest, FileRefusals) {
  write(dir_ / "empty", "\n");
  SecretStore store(dir_.string(), "file");
  EXPECT_NE(errorOf(store, "file://relative/path").find("absolute path"), std::string::npos);
  EXPECT_NE(errorOf(store, "file://").find("absolute path"), std::string::npos);
  EXPECT_NE(errorOf(store, "file://" + (dir_ / "empty").string()).find("is empty"),
            std::string::npos);
  EXPECT_NE(errorOf(store, "file://" + (dir_ / "missing").string()).find("cannot open"),
            std::string::npos);
  EXPECT_NE(errorOf(store, "file://" + dir_.string()).find("not a regular file"),
            std::string::npos);
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_NE(errorOf(store, "file://" + (dir_ / "fifo").string()).find("not a regular file"),
            std::string::npos);
  EXPECT_THROW(store.validate("file://relative"), SecretError);
  EXPECT_NO_THROW(store.validate("file:///etc/sam/x"));
}

TEST_F(SecretsTest, ErrorNamesTheReferenceNeverTheValue) {
  write(dir_ / "big", std::string(70 * 1024, 'x'));
  SecretStore store(dir_.string(), "file");
  std::string why = errorOf(store, "file://" + (dir_ / "big").string());
  EXPECT_EQ(why.rfind("file://" + (dir_ / "big").string() + ": ", 0), 0u) << why;
  EXPECT_EQ(why.find("xxxx"), std::string::npos);
}

TEST_F(SecretsTest, Env) {
  ASSERT_EQ(setenv("SECRETS_TEST_TOKEN", "env-value", 1), 0);
  ASSERT_EQ(setenv("SECRETS_TEST_EMPTY", "", 1), 0);
  unsetenv("SECRETS_TEST_UNSET");
  SecretStore store(dir_.string(), "file");
  EXPECT_EQ(store.read("env://SECRETS_TEST_TOKEN"), "env-value");
  EXPECT_NE(errorOf(store, "env://SECRETS_TEST_UNSET").find("is not set"), std::string::npos);
  EXPECT_NE(errorOf(store, "env://SECRETS_TEST_EMPTY").find("is empty"), std::string::npos);
  EXPECT_THROW(store.validate("env://"), SecretError);
  EXPECT_THROW(store.validate("env://1ABC"), SecretError);
  EXPECT_THROW(store.validate("env://A-B"), SecretError);
}

TEST_F(SecretsTest, VariableOfNamesWhatTheEnvProviderReads) {
  SecretStore file_default(dir_.string(), "file");
  EXPECT_EQ(file_default.variableOf("env://MODEL_KEY"), "MODEL_KEY");
  EXPECT_EQ(file_default.variableOf("compass-api-key"), "");  // a file under data-dir
  EXPECT_EQ(file_default.variableOf("file:///etc/k"), "");
  EXPECT_EQ(file_default.variableOf("env://"), "");  // invalid: nothing, no throw
  SecretStore env_default(dir_.string(), "env");
  EXPECT_EQ(env_default.variableOf("compass-api-key"), "COMPASS_API_KEY");
  EXPECT_EQ(env_default.variableOf("keyring://x"), "");
}

TEST_F(SecretsTest, BareNameWithFileProvider) {
  write(dir_ / "secrets" / "github-token", "gh-value\n");
  SecretStore store(dir_.string(), "file");
  EXPECT_EQ(store.read("github-token"), "gh-value");
  EXPECT_NE(errorOf(store, "other").find((dir_ / "secrets" / "other").string()), std::string::npos);
}

TEST_F(SecretsTest, BareNameWithEnvProvider) {
  ASSERT_EQ(setenv("GITHUB_TOKEN", "from-env", 1), 0);
  SecretStore store(dir_.string(), "env");
  EXPECT_EQ(store.read("github-token"), "from-env");
  EXPECT_THROW(store.validate("a.b"), SecretError);  // "A.B" is no variable name
}

TEST_F(SecretsTest, BareNamesThatCouldEscapeAreRefused) {
  SecretStore store(dir_.string(), "file");
  for (const char* bad : {"", "a/b", "..", "a..b", "../x", "has space", "tab\t"}) {
    EXPECT_THROW(store.validate(bad), SecretError) << bad;
  }
  EXPECT_THROW(store.validate("keyring://a/b"), SecretError);
  EXPECT_THROW(store.validate("keyring://"), SecretError);
  EXPECT_THROW(store.validate("vault://x"), SecretError);
  EXPECT_NE(errorOf(store, "vault://x").find("unknown secret provider"), std::string::npos);
}

TEST_F(SecretsTest, UnknownDefaultProviderIsRefused) {
  try {
    SecretStore store(dir_.string(), "vault");
    FAIL() << "accepted provider vault";
  } catch (const SecretError& e) {
    EXPECT_NE(std::string(e.what()).find("COMPASS_SECRET_PROVIDER"), std::string::npos);
  }
}

// No session bus here (DBUS_SESSION_BUS_ADDRESS pointing nowhere, no DISPLAY for autolaunch):
// the error must say that no Secret Service is reachable, for keyring:// and for a bare name
// under the keyring provider.
TEST_F(SecretsTest, KeyringWithoutSessionBusSaysSo) {
  std::string nowhere = "unix:path=" + (dir_ / "no-bus").string();
  ASSERT_EQ(setenv("DBUS_SESSION_BUS_ADDRESS", nowhere.c_str(), 1), 0);
  unsetenv("DISPLAY");
  SecretStore store(dir_.string(), "keyring");
  std::string why = errorOf(store, "keyring://github-token");
  EXPECT_EQ(why.rfind("keyring://github-token: no Secret Service reachable (", 0), 0u) << why;
  why = errorOf(store, "github-token");
  EXPECT_EQ(why.rfind("keyring://github-token: no Secret Service reachable (", 0), 0u) << why;
}

}  // namespace
}  // namespace samnode
