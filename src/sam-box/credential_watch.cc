#include "sam-box/credential_watch.h"

#include "common/log.h"

#include <asio/post.hpp>

#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace sambox {

using SystemClock = std::chrono::system_clock;

/// The worker thread holds this, not the watch: it posts its verdict only while `alive`.
struct CredentialWatch::Shared {
  std::mutex mu;
  bool alive = true;
};

CredentialWatch::CredentialWatch(asio::io_context& io, IdentityCheck check, std::string helper,
                                 const Verdict& first, std::string first_token,
                                 LapseHandler on_lapse)
    : io_(io),
      check_(std::move(check)),
      helper_(std::move(helper)),
      on_lapse_(std::move(on_lapse)),
      shared_(std::make_shared<Shared>()),
      recheck_(io),
      expiry_(io),
      expires_at_(first.expires_at),
      verified_token_(std::move(first_token)) {}

CredentialWatch::~CredentialWatch() {
  const std::lock_guard lock(shared_->mu);
  shared_->alive = false;
}

void CredentialWatch::start() {
  stopped_ = false;
  armExpiry();
  scheduleRecheck();
}

void CredentialWatch::stop() {
  stopped_ = true;
  recheck_.cancel();
  expiry_.cancel();
}

void CredentialWatch::scheduleRecheck() {
  recheck_.expires_after(kCredentialRecheck);
  recheck_.async_wait([this](const asio::error_code& ec) {
    if (ec || stopped_) return;
    recheck();
    scheduleRecheck();
  });
}

void CredentialWatch::recheck() {
  if (verifying_) return;
  std::optional<std::string> token = readTokenFile(check_.token_path);
  if (!token) {
    if (!unreadable_) {
      common::log::warn(lapsed_
                            ? "the credential file cannot be read; the identity stays lapsed"
                            : "the credential file cannot be read; the identity lasts until its "
                              "accepted credential expires",
                        {{"credential_path", check_.token_path}, {"expires_at", expires_at_}});
    }
    unreadable_ = true;
    return;
  }
  unreadable_ = false;
  if (*token == verified_token_) return;
  if (*token == refused_token_ &&
      std::chrono::steady_clock::now() < refused_at_ + kCredentialRetry) {
    return;
  }
  verifyInBackground(std::move(*token));
}

void CredentialWatch::verifyInBackground(std::string token) {
  // runVerifier() blocks for up to kVerifierTimeout (two HTTPS fetches): a thread of its own,
  // detached so that a stopping sam-box never waits for the issuer. It posts its verdict
  // while the watch is alive; the handler checks again on the loop's thread.
  auto work = [this, shared = shared_, check = check_, helper = helper_, token]() mutable {
    Verdict v = runVerifier(helper, check, token);
    const std::lock_guard lock(shared->mu);
    if (!shared->alive) return;
    asio::post(io_, [this, shared, v = std::move(v), token = std::move(token)]() mutable {
      {
        const std::lock_guard lock(shared->mu);
        if (!shared->alive) return;
      }
      onVerdict(v, std::move(token));
    });
  };
  try {
    std::thread(std::move(work)).detach();
  } catch (const std::system_error& e) {
    // No thread to be had (a pids limit shared with the agent, say): this token is tried
    // again after kCredentialRetry, as a refused one would be, and sam-box serves on.
    Verdict v;
    v.reason = kReasonVerifierUnavailable;
    v.detail = std::string("cannot start a thread for the verifier: ") + e.what();
    onVerdict(v, std::move(token));
    return;
  }
  verifying_ = true;
}

void CredentialWatch::onVerdict(const Verdict& v, std::string token) {
  verifying_ = false;
  if (stopped_) return;
  if (!v.ok) {
    refused_token_ = std::move(token);
    refused_at_ = std::chrono::steady_clock::now();
    common::log::warn(
        lapsed_ ? "a renewed credential was not accepted; the identity stays lapsed (mesh "
                  "requests refused) until a token that verifies is at --credential-path"
                : "a renewed credential was not accepted; the identity lasts until the "
                  "accepted one expires",
        {{"reason", v.reason},
         {"detail", v.detail},
         {"expires_at", expires_at_},
         {"retry_after_ms", kCredentialRetry.count()}});
    return;
  }
  verified_token_ = std::move(token);
  refused_token_.clear();
  if (v.expires_at != expires_at_) {
    // The token now in the file decides, earlier "exp" or later: a long-lived token replaced by
    // a short one (a leak answered) must not keep the identity alive.
    expires_at_ = v.expires_at;
    armExpiry();
  }
  common::log::info("credential renewed",
                    {{"subject", v.subject}, {"expires_at", expires_at_}, {"was_lapsed", lapsed_}});
  if (lapsed_ && SystemClock::now() < SystemClock::time_point(std::chrono::seconds(expires_at_))) {
    lapsed_ = false;
    on_lapse_(false);
  }
}

void CredentialWatch::armExpiry() {
  const SystemClock::time_point at{std::chrono::seconds(expires_at_)};
  expiry_.expires_at(at);
  expiry_.async_wait([this, at](const asio::error_code& ec) {
    if (ec || stopped_) return;
    // A handler already queued when a renewal re-armed the timer is not cancelled by it: it
    // runs without an error, for an "exp" that no longer holds.
    if (at != SystemClock::time_point(std::chrono::seconds(expires_at_))) return;
    if (SystemClock::now() < at) {  // the clock was stepped back: wait on
      armExpiry();
      return;
    }
    if (lapsed_) return;
    lapsed_ = true;
    common::log::warn(
        "credential expired: mesh requests are refused (credential-expired) until a token that "
        "verifies is at --credential-path",
        {{"expires_at", expires_at_}, {"credential_path", check_.token_path}});
    on_lapse_(true);
  });
}

}  // namespace sambox
