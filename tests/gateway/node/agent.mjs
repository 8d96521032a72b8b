// An agent's tool calls with the official TypeScript SDK (@modelcontextprotocol/sdk): each call on a connection of
// its own, as a retry after a disconnect or a restarted agent makes it. Prints one JSON line per call.
//
//   node agent.mjs <endpoint> <token> <tool> '<arguments JSON>' [times]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [endpoint, token, tool, argsJson, times = "1"] = process.argv.slice(2);
for (let i = 0; i < Number(times); i++) {
  const client = new Client({ name: "ts-agent", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(endpoint), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  if (tool === "--list") {
    const listed = await client.listTools();
    console.log(JSON.stringify(listed.tools.map((t) => ({ name: t.name, annotations: t.annotations }))));
  } else {
    const result = await client.callTool({ name: tool, arguments: JSON.parse(argsJson) });
    console.log(JSON.stringify(result));
  }
  await client.close();
}
