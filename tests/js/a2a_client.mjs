// An A2A client built with @a2a-js/sdk, for the sam-node tests (issue 6): what an agent does to
// call a peer agent through its node.
//
//   node a2a_client.mjs NAME [TEXT] [--base URL]
//
// Fetches the card at <base>/.well-known/agent-card.json, where base is
// http://mesh.sam.alt/a2a/NAME/ (--base overrides it, for trying the client without a node),
// lets the SDK pick the transport the card offers, sends one text message and prints one JSON
// line: {"ok": true, "card": {"name", "urls"}, "reply": text} (exit 0), or
// {"ok": false, "stage": "card" | "send", "error": message, "urls": card URLs} (exit 1).
import { randomUUID } from "node:crypto";
import { Role } from "@a2a-js/sdk";
import { ClientFactory } from "@a2a-js/sdk/client";

const args = process.argv.slice(2);
const baseAt = args.indexOf("--base");
const base = baseAt >= 0 ? args[baseAt + 1] : null;
const positional = args.filter((a, i) => !a.startsWith("--") && args[i - 1] !== "--base");
const [name, text = "please review this diff"] = positional;
if (!name && !base) {
  console.error("usage: a2a_client.mjs NAME [TEXT] [--base URL]");
  process.exit(2);
}
// The trailing slash matters: the SDK resolves the card path relative to this URL.
const url = base ?? `http://mesh.sam.alt/a2a/${name}/`;

let card = null;
const urls = () => card && (card.supportedInterfaces ?? []).map((i) => i.url);
function fail(stage, e) {
  console.log(JSON.stringify({ ok: false, stage, error: String(e?.message ?? e), urls: urls() }));
  process.exit(1);
}

let client;
try {
  client = await new ClientFactory().createFromUrl(url);
} catch (e) {
  fail("card", e);
}
card = await client.getAgentCard().catch(() => null);

let result;
try {
  result = await client.sendMessage({
    tenant: "",
    metadata: {},
    configuration: undefined,
    message: {
      messageId: randomUUID(),
      role: Role.ROLE_USER,
      parts: [{ content: { $case: "text", value: text }, metadata: undefined, filename: "",
                mediaType: "text/plain" }],
      taskId: "",
      contextId: "",
      extensions: [],
      metadata: {},
      referenceTaskIds: [],
    },
  });
} catch (e) {
  fail("send", e);
}

// A Message answers directly; a Task carries its answer in artifacts or its status message.
const parts = result.parts ?? [
  ...(result.artifacts ?? []).flatMap((a) => a.parts),
  ...(result.status?.message?.parts ?? []),
];
const reply = parts
  .filter((p) => p.content?.$case === "text")
  .map((p) => p.content.value)
  .join("\n");
console.log(
  JSON.stringify({
    ok: true,
    card: card && { name: card.name, urls: urls() },
    reply,
  }),
);
