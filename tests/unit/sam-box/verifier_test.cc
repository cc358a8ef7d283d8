#include "sam-box/verifier.h"

#include "sam-box/limits.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace sambox {
namespace {

using std::chrono::milliseconds;

TEST(VerdictTest, RoundTripsOk) {
  Verdict v;
  v.ok = true;
  v.issuer = "https://issuer.example";
  v.subject = "system:serviceaccount:agents:a";
  v.expires_at = 1'900'000'000;
  const Verdict back = parseVerdict(verdictLine(v));
  EXPECT_TRUE(back.ok);
  EXPECT_EQ(back.issuer, v.issuer);
  EXPECT_EQ(back.subject, v.subject);
  EXPECT_EQ(back.expires_at, v.expires_at);
}

TEST(VerdictTest, RoundTripsRefusal) {
  Verdict v;
  v.reason = "bad-audience";
  v.detail = "aud \"x\" does not name\nthe audience";
  const Verdict back = parseVerdict(verdictLine(v));
  EXPECT_FALSE(back.ok);
  EXPECT_EQ(back.reason, "bad-audience");
  EXPECT_EQ(back.detail, v.detail);
}

TEST(VerdictTest, AnythingElseIsARefusal) {
  for (const std::string bad : {
           "",
           "\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\"}",  // no newline
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\"}\n\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\"}\n{}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\"}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":1}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"extra\":1}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\"}\n",  // no expires_at
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":0}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":-5}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":1.5}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":\"9\"}\n",
           "{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":9,\"x\":1}\n",
           "{\"verdict\":\"OK\",\"issuer\":\"i\",\"subject\":\"s\"}\n",
           "{\"verdict\":true,\"issuer\":\"i\",\"subject\":\"s\"}\n",
           "[\"ok\"]\n",
           "ok\n",
           "{\"verdict\":\"refused\",\"reason\":\"Bad Reason\",\"detail\":\"d\"}\n",
           "{\"verdict\":\"refused\",\"reason\":\"\",\"detail\":\"d\"}\n",
           "{\"verdict\":\"refused\",\"reason\":\"x\"}\n",
       }) {
    const Verdict v = parseVerdict(bad);
    EXPECT_FALSE(v.ok) << bad;
    EXPECT_EQ(v.reason, kReasonVerifierFailed) << bad;
  }
  std::string huge = "{\"verdict\":\"refused\",\"reason\":\"x\",\"detail\":\"";
  huge += std::string(kMaxVerdictBytes, 'a') + "\"}\n";
  EXPECT_EQ(parseVerdict(huge).reason, kReasonVerifierFailed);
}

TEST(VerifierPathTest, IsBesideThisExecutable) {
  const std::string path = verifierPath();
  ASSERT_FALSE(path.empty());
  EXPECT_EQ(std::filesystem::path(path).filename(), kVerifierName);
  EXPECT_EQ(std::filesystem::path(path).parent_path(),
            std::filesystem::canonical("/proc/self/exe").parent_path());
}

constexpr std::string_view kToken = "eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n";

class RunVerifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sambox-verifier-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    check_.issuer = "https://issuer.test";
    check_.audience = "aud";
    check_.token_path = "/tok";
    check_.ca_file = "";
    check_.expected_subject = "sub-1";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// A fake helper: a shell script with `body`.
  std::string helper(const std::string& body) {
    const auto path = dir_ / "helper.sh";
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path.c_str(), 0755);
    return path.string();
  }

  /// A fake helper that refuses with `reason`, its detail being what the shell words `what`
  /// expand to (so a test reads what the helper was given).
  std::string reporting(const std::string& reason, const std::string& what) {
    return helper("printf '{\"verdict\":\"refused\",\"reason\":\"" + reason +
                  "\",\"detail\":\"%s\"}\\n' " + what + "; exit 3");
  }

  std::filesystem::path dir_;
  IdentityCheck check_;
};

TEST_F(RunVerifierTest, OkVerdictAndStatusZeroVerifies) {
  const Verdict v = runVerifier(
      helper("echo '{\"verdict\":\"ok\",\"issuer\":\"https://issuer.test\",\"subject\":\"sub-1\","
             "\"expires_at\":1900000000}'"),
      check_, kToken);
  EXPECT_TRUE(v.ok) << v.reason << ": " << v.detail;
  EXPECT_EQ(v.subject, "sub-1");
}

TEST_F(RunVerifierTest, PassesTheCheckAsArguments) {
  const Verdict v = runVerifier(reporting("args", "\"$*\""), check_, kToken);
  EXPECT_EQ(v.reason, "args");
  EXPECT_EQ(v.detail,
            "--issuer https://issuer.test --audience aud --token-path - --ca-file  "
            "--subject sub-1");
}

TEST_F(RunVerifierTest, TheTokenVerifiedIsTheOneGivenNotTheFilesLaterBytes) {
  // The helper gets the bytes sam-box read on its stdin: a file changed meanwhile cannot make
  // sam-box remember as verified a token that never was.
  const Verdict v = runVerifier(reporting("stdin", "\"$(cat)\""), check_, kToken);
  EXPECT_EQ(v.reason, "stdin");
  EXPECT_EQ(v.detail + "\n", kToken);
}

TEST_F(RunVerifierTest, ATokenOverTheLimitIsRefusedWithoutAHelper) {
  const std::string big(kMaxTokenFileBytes + 1, 'a');
  const Verdict v = runVerifier(helper("touch " + (dir_ / "ran").string()), check_, big);
  EXPECT_EQ(v.reason, "unreadable-token");
  EXPECT_NE(v.detail.find("/tok"), std::string::npos) << v.detail;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ran"));
}

TEST_F(RunVerifierTest, AnUnreadableTokenFileIsRefusedNamingIt) {
  std::string read = "stale";
  const Verdict v = verifyTokenFile(helper("exit 0"), check_, &read);
  EXPECT_EQ(v.reason, "unreadable-token");
  EXPECT_NE(v.detail.find("--credential-path /tok"), std::string::npos) << v.detail;
  EXPECT_EQ(read, "");
}

TEST_F(RunVerifierTest, TheHelperInheritsNoDescriptorOfSamBox) {
  // sam-box's sockets are not close-on-exec; the helper, which parses what the network sends,
  // must hold none of them.
  const int extra = ::fcntl(STDERR_FILENO, F_DUPFD, 200);  // no FD_CLOEXEC, as asio's sockets
  ASSERT_GE(extra, 200);
  const Verdict v =
      runVerifier(reporting("fds", "\"$(ls /proc/$$/fd | tr '\\n' ' ')\""), check_, kToken);
  ::close(extra);
  ASSERT_EQ(v.reason, "fds");
  EXPECT_EQ((" " + v.detail).find(" " + std::to_string(extra) + " "), std::string::npos)
      << v.detail;
}

TEST_F(RunVerifierTest, RefusalCarriesTheHelpersReason) {
  const Verdict v = runVerifier(
      helper("echo '{\"verdict\":\"refused\",\"reason\":\"expired\",\"detail\":\"exp passed\"}'; "
             "exit 3"),
      check_, kToken);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, "expired");
  EXPECT_EQ(v.detail, "exp passed");
}

TEST_F(RunVerifierTest, OkVerdictWithAFailureStatusIsRefused) {
  for (const char* status : {"1", "3"}) {
    const Verdict v = runVerifier(
        helper(
            std::string(
                "echo '{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":9}'; "
                "exit ") +
            status),
        check_, kToken);
    EXPECT_FALSE(v.ok) << status;
    EXPECT_EQ(v.reason, kReasonVerifierFailed) << status;
  }
}

TEST_F(RunVerifierTest, RefusalWithStatusZeroIsStillRefused) {
  const Verdict v = runVerifier(
      helper("echo '{\"verdict\":\"refused\",\"reason\":\"expired\",\"detail\":\"d\"}'"), check_,
      kToken);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, kReasonVerifierFailed);
}

TEST_F(RunVerifierTest, NoVerdictIsRefused) {
  EXPECT_EQ(runVerifier(helper("exit 0"), check_, kToken).reason, kReasonVerifierFailed);
  EXPECT_EQ(runVerifier(helper("echo garbage"), check_, kToken).reason, kReasonVerifierFailed);
}

TEST_F(RunVerifierTest, CrashIsRefused) {
  const Verdict v = runVerifier(
      helper("echo '{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":9}'; "
             "kill -SEGV $$"),
      check_, kToken);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, kReasonVerifierFailed);
}

TEST_F(RunVerifierTest, MissingOrRelativeHelperIsUnavailable) {
  EXPECT_EQ(runVerifier((dir_ / "no-such-helper").string(), check_, kToken).reason,
            kReasonVerifierUnavailable);
  EXPECT_EQ(runVerifier("sam-box-verify", check_, kToken).reason, kReasonVerifierUnavailable);
  EXPECT_EQ(runVerifier("", check_, kToken).reason, kReasonVerifierUnavailable);
}

TEST_F(RunVerifierTest, SlowHelperIsKilledAtTheDeadline) {
  const auto t0 = std::chrono::steady_clock::now();
  const Verdict v = runVerifier(helper("exec sleep 30"), check_, kToken, milliseconds(300));
  EXPECT_EQ(v.reason, kReasonVerifierTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(RunVerifierTest, HelperThatClosesStdoutButLingersIsKilled) {
  const Verdict v = runVerifier(
      helper("echo '{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\",\"expires_at\":9}'; "
             "exec >&-; exec sleep 30"),
      check_, kToken, milliseconds(300));
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, kReasonVerifierTimeout);
}

TEST(ReadTokenFileTest, OnlyARegularFileAndAtMostTheLimitPlusOne) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sambox-token-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string why;
  EXPECT_FALSE(readTokenFile(fifo.string(), &why).has_value());  // at once, no writer needed
  EXPECT_EQ(why, "not a regular file");
  EXPECT_FALSE(readTokenFile("/dev/zero").has_value());
  EXPECT_FALSE(readTokenFile((dir / "missing").string(), &why).has_value());
  EXPECT_EQ(why, "No such file or directory");
  const auto big = dir / "big";
  std::ofstream(big) << std::string(kMaxTokenFileBytes * 2, 'a');
  EXPECT_EQ(readTokenFile(big.string())->size(), kMaxTokenFileBytes + 1);
  std::ofstream(dir / "tok") << "eyJ.x.y\n";
  EXPECT_EQ(readTokenFile((dir / "tok").string()), "eyJ.x.y\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sambox
