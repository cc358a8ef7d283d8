// compass-runner: runs one agent in the tier the operator chose (seed 002). See README.md.
#include <csignal>
#include <cstdio>
#include <exception>
#include <variant>

#include "common/log.h"
#include "compass-runner/backend.h"
#include "compass-runner/image.h"
#include "compass-runner/options.h"
#include "compass-runner/roster.h"
#include "compass-runner/run.h"

namespace {

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;

int buildImage(const runner::ImageBuildOptions& opts) {
  runner::image::build(opts.build);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A reader that goes away (`compass-runner agents | head`) is not a reason to die.
  (void)std::signal(SIGPIPE, SIG_IGN);
  // The JSON lines of the firewall and its DNS forwarder name this program, not "compass".
  common::log::setProgram("compass-runner");
  auto command = runner::parseCommandLine(argc, argv);
  try {
    return std::visit(Overload{
                          [](const runner::Exit& e) {
                            (void)std::fputs(e.message.c_str(), e.exit_code == 0 ? stdout : stderr);
                            return e.exit_code;
                          },
                          [](const runner::RunOptions& o) { return runner::runAgent(o); },
                          [](const runner::AgentsOptions& o) { return runner::listAgents(o); },
                          [](const runner::StopOptions& o) { return runner::stopAgent(o); },
                          [](const runner::ResizeOptions& o) { return runner::resizeAgent(o); },
                          [](const runner::GcOptions&) { return runner::collectGarbage(); },
                          [](const runner::ImageBuildOptions& o) { return buildImage(o); },
                      },
                      command);
  } catch (const runner::SpecRefused& e) {
    // A refusal of the request itself (a bad TMPDIR or COMPASS_STATE_DIR): exit 2 from every
    // command, as `run` does (docs/compass-runner.md, "Exit codes").
    (void)std::fprintf(stderr, "compass-runner: %s\n", e.what());
    return runner::kExitUsage;
  } catch (const std::exception& e) {
    (void)std::fprintf(stderr, "compass-runner: %s\n", e.what());
    return 1;
  }
}
