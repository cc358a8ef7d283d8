#pragma once
// `compass-runner run`: one agent in the foreground (issue 4, "The seam"). The order, each a
// step that stops the chain on failure:
//   select the backend → validate the spec (refusals, nothing created yet) → id → private
//   state dir → preliminary agent.json (so gc finds a runner killed from here on) → start
//   (the backend arms everything, then execs the agent) → describe → agent.json → banner →
//   wait → remove agent.json and the state dir.
// SIGINT, SIGTERM and SIGHUP to the runner stop the agent (SIGTERM, SIGKILL after 10 s); the
// runner then exits with the agent's status.

#include "compass-runner/options.h"

namespace runner {

/// Exit code when the agent could not be started (the step and reason are on stderr), as
/// nano-init uses it (EX_SOFTWARE).
inline constexpr int kExitCannotStart = 70;

/// How long an agent has to end after SIGTERM before SIGKILL, when the runner is signalled.
inline constexpr std::chrono::seconds kStopGrace{10};

/// Runs the agent described by `opts` to completion. Returns the agent's status (0..255,
/// 128+N for signal N), kExitUsage if the tier refused the spec (in validate(), or with
/// SpecRefused from start()), kExitCannotStart if it
/// could not start. Messages go to stderr; the agent's stdout/stderr are the runner's
/// (relayed or inherited, per tier). Never throws.
int runAgent(const RunOptions& opts);

}  // namespace runner
