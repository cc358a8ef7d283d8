// An agent harness of about a hundred lines (seed 003, "What the agent sees"): ordinary
// OpenAI and MCP SDK clients with nothing SAM-specific in them. The node behind
// http://mesh.sam.alt decides which model answers and which tools this agent may see.
//
//   node harness.mjs "PROMPT" [--max-turns N] [--stream] [--model NAME]
//
// Prints progress on stderr and, last, one JSON line on stdout:
//   {"model", "tools": [names], "calls": [{"name", "arguments", "isError", "result"}],
//    "turns", "stopped": "final" | "max-turns", "final": text | null}
import OpenAI from "openai";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

// The mesh is always http://mesh.sam.alt; SAM_MESH_URL and SAM_MCP_URL exist only so the
// harness can be tried against servers on loopback without a sandbox.
const MESH = process.env.SAM_MESH_URL ?? "http://mesh.sam.alt";
const MCP_URL = process.env.SAM_MCP_URL ?? `${MESH}/mcp`;
const argv = process.argv.slice(2);
const flag = (name, dflt) => (argv.includes(name) ? argv[argv.indexOf(name) + 1] : dflt);
const valued = ["--max-turns", "--model"];
const prompt = argv.find((a, i) => !a.startsWith("--") && !valued.includes(argv[i - 1]));
const maxTurns = Number(flag("--max-turns", "8"));
const stream = argv.includes("--stream");
const log = (...m) => console.error("[harness]", ...m);

const openai = new OpenAI({ baseURL: `${MESH}/v1`, apiKey: "unused" });
const mcp = new Client({ name: "agent-harness", version: "0.1.0" });
await mcp.connect(new StreamableHTTPClientTransport(new URL(MCP_URL)));

const { tools } = await mcp.listTools();
// OpenAI function names allow [A-Za-z0-9_-]; MCP names may hold more (e.g. "fs/read_file").
const fnOf = (name) => name.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 64);
const toMcp = new Map(tools.map((t) => [fnOf(t.name), t.name]));
const fnName = new Map([...toMcp].map(([fn, name]) => [name, fn]));
const model = flag("--model", undefined) ?? (await openai.models.list()).data[0]?.id;
log(`model ${model}; tools: ${tools.map((t) => t.name).join(", ") || "(none)"}`);

const summary = { model, tools: tools.map((t) => t.name), calls: [], turns: 0 };
Object.assign(summary, { stopped: "max-turns", final: null });
const messages = [
  { role: "system", content: "You are an agent. Use the tools when they help." },
  { role: "user", content: prompt ?? "What is 2 + 3?" },
];
const request = {
  model,
  messages,
  ...(tools.length && {
    tools: tools.map((t) => ({
      type: "function",
      function: { name: fnName.get(t.name), description: t.description ?? "",
                  parameters: t.inputSchema },
    })),
  }),
};

// One assistant turn; streamed answers are put back together from their deltas.
async function complete() {
  if (!stream) return (await openai.chat.completions.create(request)).choices[0].message;
  const msg = { role: "assistant", content: "", tool_calls: [] };
  for await (const chunk of await openai.chat.completions.create({ ...request, stream: true })) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.content) msg.content += d.content;
    for (const tc of d.tool_calls ?? []) {
      const c = (msg.tool_calls[tc.index] ??=
        { id: "", type: "function", function: { name: "", arguments: "" } });
      if (tc.id) c.id = tc.id;
      if (tc.function?.name) c.function.name += tc.function.name;
      if (tc.function?.arguments) c.function.arguments += tc.function.arguments;
    }
  }
  if (!msg.tool_calls.length) delete msg.tool_calls;
  return msg;
}

for (let turn = 1; turn <= maxTurns; turn++) {
  summary.turns = turn;
  const msg = await complete();
  messages.push(msg);
  if (!msg.tool_calls?.length) {
    summary.stopped = "final";
    summary.final = msg.content;
    break;
  }
  for (const call of msg.tool_calls) {
    // A name the model made up is passed on as is: the node decides, not the harness.
    const name = toMcp.get(call.function.name) ?? call.function.name;
    let args = {};
    try {
      args = JSON.parse(call.function.arguments || "{}");
    } catch {
      log(`turn ${turn}: arguments of ${name} are not JSON; calling with {}`);
    }
    let result;
    try {
      result = await mcp.callTool({ name, arguments: args });
    } catch (e) {
      result = { isError: true, content: [{ type: "text", text: `call failed: ${e.message}` }] };
    }
    const text = (result.content ?? [])
      .map((c) => (c.type === "text" ? c.text : JSON.stringify(c)))
      .join("\n");
    const shown = `${result.isError ? "error: " : ""}${text}`;
    log(`turn ${turn}: ${name}(${JSON.stringify(args)}) -> ${shown}`);
    summary.calls.push({ name, arguments: args, isError: Boolean(result.isError), result: text });
    const content = result.isError ? `Error: ${text}` : text;
    messages.push({ role: "tool", tool_call_id: call.id, content });
  }
}

await mcp.close();
console.log(JSON.stringify(summary));
