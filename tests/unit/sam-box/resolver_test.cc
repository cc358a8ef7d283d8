#include "sam-box/resolver.h"

#include <gtest/gtest.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace sambox {
namespace {

using std::chrono::milliseconds;
using Clock = asio::steady_timer::clock_type;

// "127.0.0.1" needs neither the network nor a hosts file: getaddrinfo(3) answers it itself.
constexpr const char* kName = "127.0.0.1";

class ResolverTest : public ::testing::Test {
 protected:
  /// Runs one resolve() per entry of `names` concurrently, to completion.
  std::vector<ResolveResult> resolveAll(Resolver& r, const std::vector<std::string>& names,
                                        Clock::duration timeout = std::chrono::seconds(10)) {
    std::vector<ResolveResult> out(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      asio::co_spawn(
          io_,
          [&r, &out, i, name = names[i], timeout]() -> asio::awaitable<void> {
            out[i] = co_await r.resolve(name, Clock::now() + timeout);
          },
          asio::detached);
    }
    io_.restart();
    io_.run();
    return out;
  }

  asio::io_context io_;
};

TEST_F(ResolverTest, StartsNoThreadUntilALookupNeedsOne) {
  Resolver r(io_, 8, milliseconds(5000), 16);
  EXPECT_EQ(r.threadsStarted(), 0U);
  const auto results = resolveAll(r, {kName});
  ASSERT_EQ(results[0].gai_error, 0);
  ASSERT_EQ(results[0].addresses.size(), 1U);
  EXPECT_EQ(results[0].addresses[0].to_string(), "127.0.0.1");
  EXPECT_EQ(r.threadsStarted(), 1U);
}

TEST_F(ResolverTest, ConcurrentFlowsForOneNameShareOneLookup) {
  Resolver r(io_, 8, milliseconds(5000), 16);
  const auto results = resolveAll(r, {kName, kName, kName, kName, kName});
  for (const auto& res : results) {
    EXPECT_FALSE(res.timed_out);
    ASSERT_EQ(res.addresses.size(), 1U);
  }
  EXPECT_EQ(r.lookupsStarted(), 1U);
  EXPECT_EQ(r.threadsStarted(), 1U);
}

TEST_F(ResolverTest, AnswerIsReusedWithinItsTtl) {
  Resolver r(io_, 8, milliseconds(5000), 16);
  resolveAll(r, {kName});
  // A cached answer completes without any lookup: even a deadline already past is met.
  const auto again = resolveAll(r, {kName}, Clock::duration::zero());
  EXPECT_FALSE(again[0].timed_out);
  ASSERT_EQ(again[0].addresses.size(), 1U);
  EXPECT_EQ(r.lookupsStarted(), 1U);
}

TEST_F(ResolverTest, NoCacheMeansEveryFlowLooksUp) {
  Resolver r(io_, 8, milliseconds(0), 16);
  resolveAll(r, {kName});
  resolveAll(r, {kName});
  EXPECT_EQ(r.lookupsStarted(), 2U);
}

TEST_F(ResolverTest, ExpiredAnswerIsLookedUpAgain) {
  Resolver r(io_, 8, milliseconds(20), 16);
  resolveAll(r, {kName});
  std::this_thread::sleep_for(milliseconds(40));
  resolveAll(r, {kName});
  EXPECT_EQ(r.lookupsStarted(), 2U);
}

TEST_F(ResolverTest, CacheKeepsAtMostItsEntries) {
  Resolver r(io_, 8, milliseconds(5000), 1);
  resolveAll(r, {"127.0.0.1"});
  resolveAll(r, {"127.0.0.2"});  // evicts the first
  resolveAll(r, {"127.0.0.2"});
  EXPECT_EQ(r.lookupsStarted(), 2U);
  resolveAll(r, {"127.0.0.1"});
  EXPECT_EQ(r.lookupsStarted(), 3U);
}

TEST_F(ResolverTest, FailureIsReportedAndNotKept) {
  Resolver r(io_, 8, milliseconds(5000), 16);
  // An empty name fails inside getaddrinfo(3) without asking any server.
  const auto first = resolveAll(r, {""});
  EXPECT_NE(first[0].gai_error, 0);
  EXPECT_TRUE(first[0].addresses.empty());
  resolveAll(r, {""});
  EXPECT_EQ(r.lookupsStarted(), 2U);
}

TEST_F(ResolverTest, DeadlineEndsTheWaitNotTheLookup) {
  Resolver r(io_, 8, milliseconds(5000), 16);
  // The deadline has passed before the lookup could answer: the flow stops waiting (unless
  // the lookup won the race), and the lookup runs on; the next flow for the name waits for
  // it or finds its answer cached, but does not start another.
  resolveAll(r, {kName}, -std::chrono::seconds(1));
  const auto next = resolveAll(r, {kName});
  EXPECT_FALSE(next[0].timed_out);
  EXPECT_EQ(next[0].addresses.size(), 1U);
  EXPECT_EQ(r.lookupsStarted(), 1U);
}

}  // namespace
}  // namespace sambox
