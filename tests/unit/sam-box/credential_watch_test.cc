#include "sam-box/credential_watch.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

namespace sambox {
namespace {

using namespace std::chrono_literals;

// The clock the watch's expiry timer uses: time(2) reads a coarser one, which can still say
// the second before when the timer fires at the second's start.
int64_t nowUnix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class CredentialWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sambox-watch-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    // A stand-in for sam-box-verify: the token file holds "ok EXP" or "refuse REASON", and the
    // helper answers accordingly (the token comes on its stdin, as verifier.h gives it).
    helper_ = (dir_ / "helper.sh").string();
    std::ofstream(helper_) << "#!/bin/sh\n"
                              "read verdict value\n"
                              "if [ \"$verdict\" = ok ]; then\n"
                              "  echo '{\"verdict\":\"ok\",\"issuer\":\"i\",\"subject\":\"s\","
                              "\"expires_at\":'\"$value\"'}'\n"
                              "else\n"
                              "  echo '{\"verdict\":\"refused\",\"reason\":\"'\"$value\"'\","
                              "\"detail\":\"d\"}'; exit 3\n"
                              "fi\n";
    ::chmod(helper_.c_str(), 0755);
    check_.token_path = (dir_ / "token").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void writeToken(const std::string& text) { std::ofstream(check_.token_path) << text << "\n"; }

  /// Runs the loop until `done` or 15 s; returns whether `done` came true.
  template <typename Pred>
  bool runUntil(Pred done) {
    const auto deadline = std::chrono::steady_clock::now() + 15s;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io_.restart();
      io_.run_for(50ms);
    }
    return done();
  }

  std::unique_ptr<CredentialWatch> watch(int64_t first_exp) {
    Verdict first;
    first.ok = true;
    first.expires_at = first_exp;
    auto w = std::make_unique<CredentialWatch>(io_, check_, helper_, first,
                                               readTokenFile(check_.token_path).value_or(""),
                                               [this](bool lapsed) { events_.push_back(lapsed); });
    w->start();
    return w;
  }

  asio::io_context io_;
  std::filesystem::path dir_;
  std::string helper_;
  IdentityCheck check_;
  std::vector<bool> events_;
};

TEST_F(CredentialWatchTest, LapsesAtExpAndARenewedTokenRestoresIt) {
  const int64_t exp = nowUnix() + 1;
  writeToken("ok " + std::to_string(exp));
  auto w = watch(exp);
  ASSERT_TRUE(runUntil([&] { return w->lapsed(); }));
  EXPECT_GE(nowUnix(), exp);
  EXPECT_EQ(events_, std::vector<bool>{true});

  const int64_t later = nowUnix() + 600;
  writeToken("ok " + std::to_string(later));
  ASSERT_TRUE(runUntil([&] { return !w->lapsed(); }));
  EXPECT_EQ(w->expiresAt(), later);
  EXPECT_EQ(events_, (std::vector<bool>{true, false}));
}

TEST_F(CredentialWatchTest, ARenewalWithAnEarlierExpShortensTheIdentity) {
  // A long-lived token replaced by a short one (a leak answered): the token now in the file
  // decides.
  const int64_t exp = nowUnix() + 600;
  writeToken("ok " + std::to_string(exp));
  auto w = watch(exp);
  const int64_t sooner = nowUnix() + 1;
  writeToken("ok " + std::to_string(sooner));
  ASSERT_TRUE(runUntil([&] { return w->lapsed(); }));
  EXPECT_EQ(w->expiresAt(), sooner);
}

TEST_F(CredentialWatchTest, ARenewalQueuedBesideTheOldExpiryKeepsTheIdentity) {
  // The renewed verdict and the old expiry both become ready while the loop is busy: the
  // expiry handler, already queued, must not lapse an identity the renewal extended.
  const int64_t exp = nowUnix() + 4;
  writeToken("ok " + std::to_string(exp));
  auto w = watch(exp);
  const int64_t later = nowUnix() + 600;
  writeToken("ok " + std::to_string(later));
  const auto t0 = std::chrono::steady_clock::now();
  runUntil([&] { return std::chrono::steady_clock::now() >= t0 + kCredentialRecheck + 100ms; });
  // The verifier runs now; the loop sleeps past the old exp.
  std::this_thread::sleep_until(std::chrono::system_clock::time_point(std::chrono::seconds(exp)) +
                                500ms);
  const auto t1 = std::chrono::steady_clock::now();
  runUntil([&] { return std::chrono::steady_clock::now() >= t1 + 1s; });
  EXPECT_EQ(w->expiresAt(), later);
  EXPECT_FALSE(w->lapsed());
}

TEST_F(CredentialWatchTest, ARefusedTokenExtendsNothing) {
  const int64_t exp = nowUnix() + 3;
  writeToken("ok " + std::to_string(exp));
  auto w = watch(exp);
  writeToken("refuse bad-subject");
  ASSERT_TRUE(runUntil([&] { return w->lapsed(); }));
  EXPECT_EQ(w->expiresAt(), exp);
  EXPECT_EQ(events_, std::vector<bool>{true});
}

TEST_F(CredentialWatchTest, AnUnchangedFileIsNotVerifiedAgain) {
  // A helper that would fail the test if it ran: the file never changes, so it must not.
  std::ofstream(helper_) << "#!/bin/sh\ntouch '" << (dir_ / "ran").string() << "'\nexit 1\n";
  const int64_t exp = nowUnix() + 600;
  writeToken("ok " + std::to_string(exp));
  auto w = watch(exp);
  const auto until = std::chrono::steady_clock::now() + kCredentialRecheck * 2 + 500ms;
  runUntil([&] { return std::chrono::steady_clock::now() >= until; });
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ran"));
  EXPECT_FALSE(w->lapsed());
}

TEST_F(CredentialWatchTest, StopCancelsBothTimers) {
  const int64_t exp = nowUnix() + 1;
  writeToken("ok " + std::to_string(exp));
  auto w = watch(exp);
  w->stop();
  io_.restart();
  io_.run_for(3s);  // returns early once nothing is left to wait for
  EXPECT_FALSE(w->lapsed());
  EXPECT_TRUE(events_.empty());
}

}  // namespace
}  // namespace sambox
