#include <gtest/gtest.h>

#include "compass-runner/backend.h"

namespace runner {
namespace {

std::string selectError(const std::optional<std::string>& flag, const char* env) {
  try {
    selectBackend(flag, env);
  } catch (const RunnerError& e) {
    return e.what();
  }
  return "";
}

// A tier that is valid either selects a backend of that name or, if this build does not have
// it, refuses for that reason: never as an unknown name.
void expectSelects(const std::optional<std::string>& flag, const char* env, std::string_view tier) {
  try {
    const auto b = selectBackend(flag, env);
    EXPECT_EQ(b->name(), tier);
  } catch (const RunnerError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("unknown backend"), std::string::npos) << what;
    EXPECT_NE(what.find(std::string(tier)), std::string::npos) << what;
  }
}

TEST(SelectBackendTest, DefaultIsPodman) {
  expectSelects(std::nullopt, nullptr, "podman");
  expectSelects(std::string(""), nullptr, "podman");
  expectSelects(std::nullopt, "", "podman");
  expectSelects(std::string("podman"), nullptr, "podman");
}

TEST(SelectBackendTest, EveryValidName) {
  expectSelects(std::string("host"), nullptr, "host");
  expectSelects(std::string("microvm"), nullptr, "microvm");
  expectSelects(std::nullopt, "host", "host");
  expectSelects(std::nullopt, "microvm", "microvm");
}

TEST(SelectBackendTest, FlagWinsOverEnvironment) {
  expectSelects(std::string("host"), "podman", "host");
  expectSelects(std::string("podman"), "host", "podman");
  // Set to "" the flag still wins: it means the default, not "ask the environment".
  expectSelects(std::string(""), "host", "podman");
  // A bad environment value does not matter when the flag is given.
  expectSelects(std::string("host"), "nonsense", "host");
}

TEST(SelectBackendTest, AppleContainerIsValidButNeedsMacOs) {
  for (const auto& [flag, env] :
       {std::pair<std::optional<std::string>, const char*>{std::string("apple-container"), nullptr},
        {std::nullopt, "apple-container"}}) {
    const std::string why = selectError(flag, env);
    EXPECT_NE(why.find("needs macOS"), std::string::npos) << why;
    EXPECT_EQ(why.find("unknown backend"), std::string::npos) << why;
  }
}

TEST(SelectBackendTest, UnknownNamesListTheValidOnes) {
  for (const char* bad : {"docker", "Host", "PODMAN", " host", "kvm", "apple"}) {
    const std::string why = selectError(std::string(bad), nullptr);
    EXPECT_NE(why.find("unknown backend"), std::string::npos) << bad;
    EXPECT_NE(why.find("--backend"), std::string::npos) << why;
    for (const auto& valid : validBackendNames()) {
      EXPECT_NE(why.find(valid), std::string::npos) << why;
    }
  }
  const std::string from_env = selectError(std::nullopt, "docker");
  EXPECT_NE(from_env.find("COMPASS_RUNTIME_BACKEND"), std::string::npos) << from_env;
}

TEST(PostureTest, Names) {
  EXPECT_EQ(postureName(Posture::kBoundary), "boundary");
  EXPECT_EQ(postureName(Posture::kFirewall), "firewall");
  EXPECT_EQ(postureName(Posture::kUnenforced), "unenforced");
}

TEST(StepMessage, NamesTheStepOnce) {
  EXPECT_EQ(stepMessage("netns", "create x: EEXIST"), "netns: create x: EEXIST");
  EXPECT_EQ(stepMessage("netns", "netns: create x: EEXIST"), "netns: create x: EEXIST");
  EXPECT_EQ(stepMessage("tun0", "netns: tun0: ioctl"), "tun0: netns: tun0: ioctl");
  EXPECT_EQ(stepMessage("sam-box", "sam-boxes"), "sam-box: sam-boxes");
  EXPECT_EQ(stepMessage("x", ""), "x: ");
}

// A preflight says everything that is missing in one error, not one per attempt.
TEST(CheckAll, NamesEveryFailureInOneError) {
  int ran = 0;
  try {
    checkAll({[&] { ++ran; },
              [&] {
                ++ran;
                throw RunnerError("cannot run podman");
              },
              [&] {
                ++ran;
                throw RunnerError("cannot run nft");
              },
              [&] { ++ran; }});
    FAIL() << "no error";
  } catch (const SpecRefused&) {
    FAIL() << "no check refused the request";
  } catch (const RunnerError& e) {
    EXPECT_STREQ(e.what(), "cannot run podman; cannot run nft");
  }
  EXPECT_EQ(ran, 4);  // every check ran, also after the first failure
}

TEST(CheckAll, ARefusalAmongThemMakesItARefusal) {
  EXPECT_THROW(checkAll({[] { throw RunnerError("cannot run ip"); },
                         [] { throw SpecRefused("qemu-system-x86_64: not found"); }}),
               SpecRefused);
}

TEST(CheckAll, AStopPassesAtOnceAndNothingFailingIsSilent) {
  bool later = false;
  EXPECT_THROW(checkAll({[] { throw StoppedBeforeStart(15); }, [&] { later = true; }}),
               StoppedBeforeStart);
  EXPECT_FALSE(later);
  EXPECT_NO_THROW(checkAll({[] {}, [] {}}));
  EXPECT_NO_THROW(checkAll({}));
}

}  // namespace
}  // namespace runner
