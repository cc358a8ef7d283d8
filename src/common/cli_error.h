#pragma once
// How sam-box and sam-node report a command line CLI11 refused: one line on stderr that starts
// with the program's name and says what was wrong with what the operator typed.

#include <CLI/CLI.hpp>

#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace common {

/// What to print for a CLI11 parse error of `app`, and the exit status.
struct ParseErrorReport {
  int status = 0;   ///< 0 for --help and --version (CLI11's "success" errors), else usage
  std::string out;  ///< for stdout: the help or version text
  std::string err;  ///< for stderr: "PROGRAM: <CLI11's message>", empty when status is 0
};

/// The report for `e`: --help and --version give status 0 and their text in `out`; anything
/// else gives `usage_status` and "PROGRAM: <CLI11's message>" in `err`. CLI11 checks required
/// options and subcommands before unknown arguments, so `sam-box run --bogus` would be told
/// only "--socket is required": when the command line also held arguments nobody takes, those
/// are reported instead ("The following argument was not expected: --bogus"), as they are the
/// likelier mistake (a misspelt flag or command).
inline ParseErrorReport describeParseError(const CLI::App& app, const CLI::ParseError& e,
                                           std::string_view program, int usage_status) {
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    if (std::vector<std::string> extra = app.remaining(true); !extra.empty()) {
      return describeParseError(app, CLI::ExtrasError(std::move(extra)), program, usage_status);
    }
  }
  std::ostringstream out;
  std::ostringstream err;
  const int code = app.exit(e, out, err);
  if (code == 0) return {0, out.str(), ""};
  return {usage_status, out.str(), std::string(program) + ": " + err.str()};
}

/// describeParseError(), printed: `out` to stdout, `err` to stderr. Returns the status.
inline int reportParseError(const CLI::App& app, const CLI::ParseError& e, std::string_view program,
                            int usage_status) {
  const ParseErrorReport r = describeParseError(app, e, program, usage_status);
  std::cout << r.out << std::flush;
  std::cerr << r.err << std::flush;
  return r.status;
}

}  // namespace common
