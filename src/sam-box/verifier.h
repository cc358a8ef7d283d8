#pragma once
// The start-up credential check, run in a separate short-lived program (sam-box-verify).
// Verifying needs libcurl (OIDC discovery, JWKS over HTTPS) and libcrypto (RS256/ES256) once,
// at start; linking them into the long-lived boundary would keep their shared-library closure
// resident for the agent's whole life (about 5 MiB of VmRSS). So sam-box spawns the helper,
// found next to its own executable, and reads one verdict line from it. Anything other than
// an "ok" verdict together with exit status 0 refuses the start (fail closed).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sambox {

/// File name of the helper; it is looked for in the directory of sam-box's own executable.
inline constexpr const char* kVerifierName = "sam-box-verify";
/// Exit status of the helper when the credential was refused (the verdict says why).
inline constexpr int kVerifierExitRefused = 3;
/// Longest verdict read from the helper, in bytes; a longer one is refused.
inline constexpr size_t kMaxVerdictBytes = size_t{64} * 1024;
/// The whole check (two HTTPS fetches of at most 10 s each, plus signature checks) must end
/// within this; the helper is killed after it and the start refused.
inline constexpr std::chrono::milliseconds kVerifierTimeout{30'000};

// Reasons of the refusals decided by sam-box itself (the helper's own come from policy).
inline constexpr const char* kReasonVerifierUnavailable = "verifier-unavailable";
inline constexpr const char* kReasonVerifierFailed = "verifier-failed";
inline constexpr const char* kReasonVerifierTimeout = "verifier-timeout";

/// What to verify: the flags of `sam-box run` and the bundle's agent.external_id.
struct IdentityCheck {
  std::string issuer;            ///< --credential-issuer
  std::string audience;          ///< --credential-audience
  std::string token_path;        ///< --credential-path
  std::string ca_file;           ///< --credential-ca (empty: system store)
  std::string expected_subject;  ///< the bundle's agent.external_id
};

/// The helper's answer.
struct Verdict {
  bool ok = false;
  std::string reason;      ///< refusal: stable kebab-case reason ("bad-audience", ...)
  std::string detail;      ///< refusal: a sentence for the operator
  std::string issuer;      ///< ok: the verified "iss"
  std::string subject;     ///< ok: the verified "sub"
  int64_t expires_at = 0;  ///< ok: the verified "exp", seconds since the Unix epoch (> 0)
};

/// Reads a platform token file as both the helper (identity.h) and the recheck
/// (credential_watch.h) do: its bytes, at most kMaxTokenFileBytes + 1 of them (more means too
/// large), from a regular file only, opened without blocking (a FIFO or device at the path
/// must not stall the caller). Returns std::nullopt, with `*why` (if given) saying what failed,
/// if the file cannot be opened or read or is not a regular file.
std::optional<std::string> readTokenFile(const std::string& path, std::string* why = nullptr);

/// The bounded read readTokenFile() makes, from an open descriptor (sam-box-verify's stdin):
/// at most kMaxTokenFileBytes + 1 bytes, up to end of file. std::nullopt, with `*why` (if
/// given), on a read error.
std::optional<std::string> readToken(int fd, std::string* why = nullptr);

/// Refusal reason of a token that cannot be used as read (missing, not a regular file, over
/// kMaxTokenFileBytes), and its detail: "--credential-path PATH: WHY".
inline constexpr const char* kReasonUnreadableToken = "unreadable-token";
std::string unreadableTokenDetail(const std::string& path, const std::string& why);

/// unreadableTokenDetail() for a token over kMaxTokenFileBytes.
std::string tokenTooLargeDetail(const std::string& path);

/// One JSON line (with the trailing newline) carrying `v`.
std::string verdictLine(const Verdict& v);

/// Parses what the helper wrote. Never throws: anything that is not exactly one well-formed
/// verdict object is a refusal with reason kReasonVerifierFailed.
Verdict parseVerdict(std::string_view text);

/// The helper's path: kVerifierName in the directory of /proc/self/exe. Empty if that link
/// cannot be read.
std::string verifierPath();

/// Runs `helper` (an absolute path; no PATH search) with `check` as its arguments and
/// `token` (the token file's bytes, as readTokenFile() read them) on its stdin, its
/// --token-path being "-": the token verified is the one the caller holds, whatever the file
/// says by then. Reads the verdict from a pipe and reaps the helper. Returns an ok verdict
/// only if the helper said ok and exited with status 0. A token over kMaxTokenFileBytes is
/// refused "unreadable-token" without a helper; a helper that cannot be started gives
/// kReasonVerifierUnavailable, one that outlives `timeout` is killed and gives
/// kReasonVerifierTimeout, one that crashes or writes no well-formed verdict gives
/// kReasonVerifierFailed.
Verdict runVerifier(const std::string& helper, const IdentityCheck& check, std::string_view token,
                    std::chrono::milliseconds timeout = kVerifierTimeout);

/// The token at check.token_path, read with readTokenFile() and verified by runVerifier();
/// one that cannot be read is refused "unreadable-token" naming the file. `*token`, if given,
/// receives the bytes verified (empty if none were read).
Verdict verifyTokenFile(const std::string& helper, const IdentityCheck& check,
                        std::string* token = nullptr);

/// The helper's command line for `check` (argv[1..]), shared by runVerifier() and the
/// helper's own parser so that the two cannot drift.
inline constexpr const char* kArgIssuer = "--issuer";
inline constexpr const char* kArgAudience = "--audience";
inline constexpr const char* kArgTokenPath = "--token-path";  ///< "-": the token is on stdin
inline constexpr const char* kArgCaFile = "--ca-file";
inline constexpr const char* kArgSubject = "--subject";

}  // namespace sambox
