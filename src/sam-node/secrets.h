#pragma once
// Secret providers (issue 6; seed 002 names COMPASS_SECRET_PROVIDER for the host tier):
// file://PATH, env://VAR, keyring://NAME (Secret Service via libsecret). A bare NAME uses the
// default provider from COMPASS_SECRET_PROVIDER ("file" if unset). Values are read on each use
// (rotation needs no restart) and never logged.

#include <stdexcept>
#include <string>
#include <string_view>

namespace samnode {

/// A secret that could not be read; what() names the reference and the reason, never the value.
class SecretError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class SecretStore {
 public:
  /// `data_dir`: bare names with the file provider are `<data_dir>/secrets/NAME`.
  /// `default_provider`: "file", "env" or "keyring"; throws SecretError otherwise
  /// (the caller passes getenv("COMPASS_SECRET_PROVIDER") or "file").
  SecretStore(std::string data_dir, std::string default_provider);

  /// Checks the syntax of a reference without reading it. Throws SecretError.
  void validate(std::string_view ref) const;
  /// Reads the value (one trailing newline of a file is dropped). Throws SecretError: missing
  /// file/variable/item, empty value, no Secret Service reachable.
  [[nodiscard]] std::string read(std::string_view ref) const;
  /// The environment variable `ref` is read from (env://VAR, or a bare name with the env
  /// provider: upper case, '-' as '_'), or "" for another provider or an invalid reference.
  /// Never throws.
  [[nodiscard]] std::string variableOf(std::string_view ref) const;

 private:
  std::string data_dir_;
  std::string default_provider_;
};

}  // namespace samnode
