// A real MCP server built with @modelcontextprotocol/sdk, for the sam-node tests (issue 6).
//
//   node mcp_server.mjs PORT [--sse] [--name NAME]
//
// Serves MCP over Streamable HTTP at http://127.0.0.1:PORT/mcp (PORT 0 = any free port),
// stateless (no Mcp-Session-Id: every POST is answered on its own, so a proxy in front needs
// no session affinity). Responses are JSON by default; --sse answers with the SDK's SSE
// framing instead, which a proxy must also understand. Prints `ready <port>` on stdout when
// it listens, then one JSON line per tool call it executes ({"call": name, "arguments"}), so
// a test can assert that a refused call never reached this server.
//
// Tools: add(a, b), read_note(name), delete_everything() (the one a role should not grant).
import http from "node:http";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const args = process.argv.slice(2);
const port = Number(args[0] ?? "0");
const sse = args.includes("--sse");
const nameAt = args.indexOf("--name");
const serverName = nameAt >= 0 ? args[nameAt + 1] : "sam-test-tools";
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`mcp_server: PORT must be 0..65535, got ${args[0]}`);
  process.exit(2);
}

const NOTES = { todo: "buy milk", plan: "ship sam-node" };

const TOOLS = [
  {
    name: "add",
    description: "Adds two numbers.",
    inputSchema: {
      type: "object",
      properties: { a: { type: "number" }, b: { type: "number" } },
      required: ["a", "b"],
    },
  },
  {
    name: "read_note",
    description: "Returns the text of a note by name.",
    inputSchema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
  },
  {
    name: "delete_everything",
    description: "Deletes every note. Dangerous.",
    inputSchema: { type: "object", properties: {} },
  },
];

function text(t, isError = false) {
  return { content: [{ type: "text", text: t }], isError };
}

function callTool(name, a) {
  switch (name) {
    case "add":
      if (typeof a.a !== "number" || typeof a.b !== "number") {
        return text("add: a and b must be numbers", true);
      }
      return text(String(a.a + a.b));
    case "read_note":
      return a.name in NOTES ? text(NOTES[a.name]) : text(`read_note: no note ${a.name}`, true);
    case "delete_everything":
      return text("deleted everything");
    default:
      return text(`unknown tool ${name}`, true);
  }
}

function makeServer() {
  const server = new Server({ name: serverName, version: "1.0.0" },
                            { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const { name, arguments: a = {} } = req.params;
    process.stdout.write(JSON.stringify({ call: name, arguments: a }) + "\n");
    return callTool(name, a);
  });
  return server;
}

const httpServer = http.createServer(async (req, res) => {
  const path = new URL(req.url, "http://x").pathname;
  if (path !== "/mcp") {
    res.writeHead(404, { "Content-Type": "text/plain" }).end(`no route ${path}\n`);
    return;
  }
  // Stateless: one Server and transport per request (the SDK's documented stateless pattern).
  const server = makeServer();
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: undefined,
    enableJsonResponse: !sse,
  });
  res.on("close", () => {
    transport.close();
    server.close();
  });
  try {
    await server.connect(transport);
    await transport.handleRequest(req, res);
  } catch (e) {
    console.error(`mcp_server: ${e.stack || e}`);
    if (!res.headersSent) res.writeHead(500).end();
  }
});

httpServer.listen(port, "127.0.0.1", () => {
  process.stdout.write(`ready ${httpServer.address().port}\n`);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
