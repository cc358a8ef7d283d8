#pragma once
// Keeps the verified agent identity current after start (seed 003, "Identity is asserted about
// the agent, not by the agent"). The platform token proves agent.external_id only until its
// "exp"; a projected service account token is short-lived and rotated in place by the kubelet.
// So sam-box re-reads the token file every kCredentialRecheck, verifies a changed token again
// with sam-box-verify (verifier.h, on a worker thread: the event loop never waits for the
// issuer), and extends the identity to the new token's "exp". Once the "exp" of the last
// accepted token has passed with none renewed, the identity has lapsed: mesh requests are
// refused (Boundary-Reason credential-expired) until a token that verifies is at
// --credential-path again. External egress is not affected: it asserts no identity.

#include "sam-box/verifier.h"

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/system_timer.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace sambox {

/// How often the token file is re-read (at most kMaxTokenFileBytes). The issuer is asked again
/// only when the file's bytes changed.
inline constexpr std::chrono::milliseconds kCredentialRecheck{2000};
/// A changed token that was refused is not verified again before this much time has passed
/// (an issuer that is down is not asked at every recheck).
inline constexpr std::chrono::milliseconds kCredentialRetry{30'000};

class CredentialWatch {
 public:
  /// Called on the io_context's thread: true when the identity lapses, false when a renewed
  /// credential restores it.
  using LapseHandler = std::function<void(bool lapsed)>;

  /// `check` and `helper` as given to runVerifier() at start; `first` is the start-up verdict
  /// (ok, with its expires_at in Unix seconds) and `first_token` the token file's bytes as read
  /// (readTokenFile) just before that verification.
  CredentialWatch(asio::io_context& io, IdentityCheck check, std::string helper,
                  const Verdict& first, std::string first_token, LapseHandler on_lapse);
  ~CredentialWatch();
  CredentialWatch(const CredentialWatch&) = delete;
  CredentialWatch& operator=(const CredentialWatch&) = delete;

  /// Arms the recheck and the expiry timers (an "exp" already past lapses at once).
  void start();
  /// Cancels both timers. A verification under way finishes on its own; its verdict is dropped.
  void stop();

  /// The "exp" of the latest accepted token, in seconds since the Unix epoch.
  [[nodiscard]] int64_t expiresAt() const { return expires_at_; }
  [[nodiscard]] bool lapsed() const { return lapsed_; }

 private:
  struct Shared;  // what the worker thread may touch after this object is gone

  void scheduleRecheck();
  void recheck();
  void verifyInBackground(std::string token);
  void onVerdict(const Verdict& v, std::string token);
  void armExpiry();

  asio::io_context& io_;
  IdentityCheck check_;
  std::string helper_;
  LapseHandler on_lapse_;
  std::shared_ptr<Shared> shared_;
  asio::steady_timer recheck_;
  asio::system_timer expiry_;
  int64_t expires_at_ = 0;
  bool lapsed_ = false;
  bool verifying_ = false;
  bool unreadable_ = false;
  bool stopped_ = false;
  std::string verified_token_;
  std::string refused_token_;
  std::chrono::steady_clock::time_point refused_at_{};
};

}  // namespace sambox
