// The egress firewall's admitter (admitter.h): answered addresses reach the allow sets before
// admit() returns, loads that arrive together are committed by one AddFn call, a failed load
// fails every caller that needed it, and the sets' bound holds.
#include "compass-runner/admitter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace runner::firewall {
namespace {

AllowElement element(unsigned n, std::optional<uint16_t> port = 443) {
  return {asio::ip::address_v4(0x0A4D0000U + n), port, "n" + std::to_string(n) + ".example"};
}

// An AddFn that records each batch it was given; the first call can be held until released.
class RecordingAdd {
 public:
  AddFn fn() {
    return [this](const std::vector<AllowElement>& batch) {
      std::unique_lock lock(mu_);
      batches_.push_back(batch);
      entered_.notify_all();
      released_.wait(lock, [&] { return !hold_; });
      return fail_ == nullptr || !fail_(batch);
    };
  }
  void hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      hold_ = false;
    }
    released_.notify_all();
  }
  void awaitCalls(size_t n) {
    std::unique_lock lock(mu_);
    entered_.wait(lock, [&] { return batches_.size() >= n; });
  }
  void failWhen(std::function<bool(const std::vector<AllowElement>&)> f) { fail_ = std::move(f); }
  std::vector<std::vector<AllowElement>> batches() {
    std::lock_guard lock(mu_);
    return batches_;
  }

 private:
  std::mutex mu_;
  std::condition_variable entered_, released_;
  bool hold_ = false;
  std::function<bool(const std::vector<AllowElement>&)> fail_;
  std::vector<std::vector<AllowElement>> batches_;
};

// Waits until `n` elements wait for the next load (their callers are inside admit()).
void awaitPending(const Admitter& admitter, size_t n) {
  while (admitter.pendingElements() < n) std::this_thread::yield();
}

TEST(AdmitterTest, NewElementsAreLoadedOnceAndKnownOnesCostNothing) {
  RecordingAdd add;
  Admitter admitter("a0123456789", add.fn());
  EXPECT_TRUE(admitter.admit({element(1), element(2)}));
  EXPECT_TRUE(admitter.admit({element(2), element(1)}));
  EXPECT_TRUE(admitter.admit({element(1)}));
  ASSERT_EQ(add.batches().size(), 1U);
  EXPECT_EQ(add.batches()[0].size(), 2U);
  // Another port of the same address is another element.
  EXPECT_TRUE(admitter.admit({element(1, 80), element(1, 80)}));
  ASSERT_EQ(add.batches().size(), 2U);
  EXPECT_EQ(add.batches()[1].size(), 1U);  // given twice in one call, loaded once
}

TEST(AdmitterTest, CallersArrivingDuringALoadShareTheNextOne) {
  RecordingAdd add;
  Admitter admitter("a0123456789", add.fn());
  add.hold();
  auto first = std::async(std::launch::async, [&] { return admitter.admit({element(1)}); });
  add.awaitCalls(1);
  std::vector<std::future<bool>> later;
  for (unsigned n = 2; n <= 5; ++n) {
    later.push_back(
        std::async(std::launch::async, [&, n] { return admitter.admit({element(n)}); }));
  }
  awaitPending(admitter, 4);
  // Nobody returned before its elements were loaded.
  for (auto& f : later) {
    EXPECT_EQ(f.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  }
  add.release();
  EXPECT_TRUE(first.get());
  for (auto& f : later) EXPECT_TRUE(f.get());
  const auto batches = add.batches();
  ASSERT_EQ(batches.size(), 2U);
  EXPECT_EQ(batches[1].size(), 4U);
  EXPECT_EQ(admitter.loads(), 2U);
}

TEST(AdmitterTest, AFailedLoadFailsEveryCallerThatNeededItAndIsTriedAgainLater) {
  RecordingAdd add;
  Admitter admitter("a0123456789", add.fn());
  std::atomic<bool> failing{true};
  add.failWhen([&](const std::vector<AllowElement>&) { return failing.load(); });
  add.hold();
  auto first = std::async(std::launch::async, [&] { return admitter.admit({element(1)}); });
  add.awaitCalls(1);
  // Needs element 1, which the held (failing) load carries: its outcome is this caller's too.
  auto same = std::async(std::launch::async, [&] {
    return admitter.admit({element(1), element(9)});
  });
  awaitPending(admitter, 1);  // element 9 queued: the caller is in, waiting
  add.release();
  EXPECT_FALSE(first.get());
  EXPECT_FALSE(same.get());
  // Nothing of a failed load counts as added: asked again, it is loaded again.
  failing = false;
  EXPECT_TRUE(admitter.admit({element(1)}));
  const auto batches = add.batches();
  ASSERT_GE(batches.size(), 2U);
  EXPECT_EQ(batches.back(), std::vector<AllowElement>{element(1)});
}

TEST(AdmitterTest, TheSetsBoundRefusesWithoutLoading) {
  RecordingAdd add;
  Admitter admitter("a0123456789", add.fn());
  std::vector<AllowElement> many;
  for (unsigned n = 1; n <= kMaxSetElements; ++n) many.push_back(element(n));
  EXPECT_TRUE(admitter.admit(many));
  EXPECT_FALSE(admitter.admit({element(kMaxSetElements + 1)}));
  EXPECT_TRUE(admitter.admit({element(7)}));  // already in: no new room needed
  EXPECT_EQ(admitter.loads(), 1U);
}

TEST(AdmitterTest, AThrowingLoadIsAFailureNotACrash) {
  Admitter admitter("a0123456789", [](const std::vector<AllowElement>&) -> bool {
    throw std::runtime_error("nft: cannot start");
  });
  EXPECT_FALSE(admitter.admit({element(1)}));
  EXPECT_FALSE(admitter.admit({element(1)}));
  EXPECT_EQ(admitter.loads(), 2U);
}

}  // namespace
}  // namespace runner::firewall
