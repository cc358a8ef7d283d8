// compass-runner: runs one agent in the tier the operator chose (seed 002). See README.md.
#include <cstdio>
#include <variant>

#include "compass-runner/options.h"

int main(int argc, char** argv) {
  auto command = runner::parseCommandLine(argc, argv);
  if (auto* exit = std::get_if<runner::Exit>(&command)) {
    std::fputs(exit->message.c_str(), exit->exit_code == 0 ? stdout : stderr);
    return exit->exit_code;
  }
  std::fputs("compass-runner: not built yet in this tree\n", stderr);
  return 70;
}
