// sam-box-verify: the start-up credential check of sam-box, as a short-lived program
// (verifier.h says why). sam-box runs it once with the flags below and reads one JSON verdict
// line from its stdout; it is not meant to be run by hand, but can be:
//
//   sam-box-verify --issuer URL --audience AUD --token-path FILE --ca-file FILE --subject SUB
//
// sam-box gives --token-path - and the token's bytes on stdin (the bytes it read itself), so
// what it remembers as verified is what was verified.
//
// Exit status: 0 verified, 3 refused (the verdict says why), 2 bad command line.

#include "policy/jwt.h"
#include "sam-box/identity.h"
#include "sam-box/verifier.h"

#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <optional>
#include <string>

namespace {

constexpr int kExitUsage = 2;

int usage(const std::string& why) {
  std::fprintf(stderr,
               "sam-box-verify: %s\nusage: sam-box-verify --issuer URL --audience AUD "
               "--token-path FILE --ca-file FILE|'' --subject SUB\n",
               why.c_str());
  return kExitUsage;
}

int emit(const sambox::Verdict& v) {
  const std::string line = sambox::verdictLine(v);
  const bool written = std::fwrite(line.data(), 1, line.size(), stdout) == line.size();
  if (std::fflush(stdout) != 0 || !written) return kExitUsage;  // sam-box refuses: no verdict
  return v.ok ? 0 : sambox::kVerifierExitRefused;
}

}  // namespace

int main(int argc, char** argv) {
  // Dies with sam-box (prctl(2) PR_SET_PDEATHSIG): a sam-box killed with SIGKILL (with the
  // runner that started it) must not leave this fetching for the rest of its timeout. Had
  // sam-box died before this call, the verdict pipe already has no reader (POLLERR, poll(2)).
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
  pollfd out{STDOUT_FILENO, POLLOUT, 0};
  if (::poll(&out, 1, 0) == 1 && (out.revents & POLLERR) != 0) return kExitUsage;
  std::map<std::string, std::string*> flags;
  sambox::IdentityCheck check;
  flags[sambox::kArgIssuer] = &check.issuer;
  flags[sambox::kArgAudience] = &check.audience;
  flags[sambox::kArgTokenPath] = &check.token_path;
  flags[sambox::kArgCaFile] = &check.ca_file;
  flags[sambox::kArgSubject] = &check.expected_subject;
  std::map<std::string, bool> seen;
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    const auto it = flags.find(key);
    if (it == flags.end()) return usage("unknown argument " + key);
    if (i + 1 >= argc) return usage(key + " needs a value");
    if (seen[key]) return usage(key + " given twice");
    seen[key] = true;
    *it->second = argv[i + 1];
  }
  if (seen.size() != flags.size()) return usage("every flag is required");

  sambox::Verdict v;
  try {
    std::string why;
    const std::optional<std::string> token = check.token_path == "-"
                                                 ? sambox::readToken(STDIN_FILENO, &why)
                                                 : sambox::readTokenFile(check.token_path, &why);
    if (!token) {
      throw policy::CredentialError(sambox::kReasonUnreadableToken,
                                    sambox::unreadableTokenDetail(check.token_path, why));
    }
    const policy::VerifiedClaims claims = sambox::verifyIdentity(check, *token);
    v.ok = true;
    v.issuer = claims.issuer;
    v.subject = claims.subject;
    v.expires_at =
        std::chrono::duration_cast<std::chrono::seconds>(claims.expires_at.time_since_epoch())
            .count();
  } catch (const policy::CredentialError& e) {
    v.reason = e.reason();
    v.detail = e.what();
  } catch (const std::exception& e) {
    v.reason = sambox::kReasonVerifierFailed;
    v.detail = e.what();
  }
  return emit(v);
}
