// An A2A agent built with @a2a-js/sdk (protocol v1.0, JSON-RPC binding), for the sam-node
// tests (issue 6, "Agents that serve" in seed 003).
//
//   node a2a_agent.mjs PORT [--name NAME]
//
// Listens on 127.0.0.1:PORT (inside its sandbox: the port the bundle's `serves` names), serves
// its card at /.well-known/agent-card.json and JSON-RPC at /. Every message is answered with
// one agent message: `NAME reviewed: <text> (caller <X-Sam-Caller>)`, so a test can see both
// that the request arrived and which caller the node named. Prints `ready <port>` on stdout
// once it listens; logs each message as a JSON line on stdout.
import { randomUUID } from "node:crypto";
import http from "node:http";
import express from "express";
import { AGENT_CARD_PATH, A2A_PROTOCOL_VERSION, Role } from "@a2a-js/sdk";
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore } from "@a2a-js/sdk/server";
import { UserBuilder, agentCardHandler, jsonRpcHandler } from "@a2a-js/sdk/server/express";

const args = process.argv.slice(2);
const port = Number(args[0]);
const nameAt = args.indexOf("--name");
const name = nameAt >= 0 ? args[nameAt + 1] : "code-reviewer";
if (!Number.isInteger(port) || port < 1 || port > 65535) {
  console.error(`a2a_agent: PORT must be 1..65535, got ${args[0]}`);
  process.exit(2);
}

// The agent only knows where it listens; the node rewrites the URL it advertises so that
// callers keep talking through the node.
const card = {
  name,
  description: "Reviews what it is sent (a test agent).",
  supportedInterfaces: [
    {
      url: `http://127.0.0.1:${port}/`,
      protocolBinding: "JSONRPC",
      tenant: "",
      protocolVersion: A2A_PROTOCOL_VERSION,
    },
  ],
  provider: { organization: "sam tests", url: "https://example.invalid/sam-tests" },
  version: "1.0.0",
  capabilities: {
    streaming: false,
    pushNotifications: false,
    extensions: [],
    extendedAgentCard: false,
  },
  securitySchemes: {},
  securityRequirements: [],
  defaultInputModes: ["text/plain"],
  defaultOutputModes: ["text/plain"],
  skills: [
    {
      id: "review",
      name: "Review",
      description: "Answers with a review of the text it is sent.",
      tags: ["test"],
      examples: ["review this"],
      inputModes: ["text/plain"],
      outputModes: ["text/plain"],
      securityRequirements: [],
    },
  ],
  documentationUrl: "",
  signatures: [],
};

const executor = {
  async execute(ctx, bus) {
    const text = ctx.userMessage.parts
      .filter((p) => p.content?.$case === "text")
      .map((p) => p.content.value)
      .join(" ");
    const headers = ctx.context?.state?.get("headers") ?? {};
    const caller = headers["x-sam-caller"] ?? "(none)";
    process.stdout.write(JSON.stringify({ message: text, caller }) + "\n");
    bus.publish(
      AgentEvent.message({
        messageId: randomUUID(),
        contextId: ctx.contextId,
        taskId: "",
        role: Role.ROLE_AGENT,
        parts: [
          {
            content: { $case: "text", value: `${name} reviewed: ${text} (caller ${caller})` },
            metadata: undefined,
            filename: "",
            mediaType: "text/plain",
          },
        ],
        metadata: {},
        extensions: [],
        referenceTaskIds: [],
      }),
    );
    bus.finished();
  },
  async cancelTask() {},
};

const handler = new DefaultRequestHandler(card, new InMemoryTaskStore(), executor);
const app = express();
app.use(`/${AGENT_CARD_PATH}`, agentCardHandler({ agentCardProvider: handler }));
app.use("/", jsonRpcHandler({ requestHandler: handler,
                             userBuilder: UserBuilder.noAuthentication }));
// http.Server rather than app.listen: Express 5 calls listen's callback on errors too.
const server = http.createServer(app);
server.on("listening", () => process.stdout.write(`ready ${port}\n`));
server.on("error", (e) => {
  console.error(`a2a_agent: cannot listen on 127.0.0.1:${port}: ${e.message}`);
  process.exit(1);
});
server.listen(port, "127.0.0.1");
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
