// Files in and out through the official TypeScript MCP SDK: run_python with a
// CSV in "files" that writes a summary CSV to /workspace/out and draws a
// chart; resources/read of the summary's resource_link; then, as another
// namespace (a second token), resources/read of the same URI. Prints one
// JSON line.
//
// usage: node files_client.mjs URL TOKEN OTHER_TOKEN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, other] = process.argv.slice(2);
const connect = async (tok) => {
  const c = new Client({ name: "mcpexec-files-test", version: "1.0.0" });
  await c.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${tok}` } } }));
  return c;
};
const client = await connect(token);
const code = `import csv, collections, os
tot = collections.Counter()
for row in csv.DictReader(open("sales.csv")):
    tot[row["region"]] += int(row["amount"])
os.makedirs("out", exist_ok=True)
with open("out/summary.csv", "w") as f:
    f.write("region,total\\n")
    for k in sorted(tot):
        f.write("%s,%d\\n" % (k, tot[k]))
print("regions:", len(tot))`;
const res = await client.callTool(
  { name: "run_python", arguments: { code, files: [{ name: "sales.csv", text: "region,amount\nnorth,3\nsouth,5\nnorth,4\n" }] } },
  undefined,
  { timeout: 120000 },
);
const link = res.content.find((c) => c.type === "resource_link");
const read = link ? await client.readResource({ uri: link.uri }) : null;
const plot = await client.callTool(
  {
    name: "run_python",
    arguments: {
      code: 'import pandas as pd, matplotlib.pyplot as plt\ndf = pd.DataFrame({"x": [1, 2, 3], "y": [2, 4, 3]})\ndf.plot(x="x", y="y")\nplt.show()\nprint("plotted")',
    },
  },
  undefined,
  { timeout: 120000 },
);
const image = plot.content.find((c) => c.type === "image");
let otherError = "";
if (link) {
  const spy = await connect(other);
  try {
    await spy.readResource({ uri: link.uri });
    otherError = "read it";
  } catch (e) {
    otherError = String(e.message || e);
  }
  await spy.close();
}
console.log(
  JSON.stringify({
    text: res.content[0].text,
    isError: res.isError ?? false,
    files: res.structuredContent?.files ?? [],
    linkUri: link?.uri ?? "",
    linkMime: link?.mimeType ?? "",
    readText: read?.contents?.[0]?.text ?? "",
    plotText: plot.content[0].text,
    plotError: plot.isError ?? false,
    imageMime: image?.mimeType ?? "",
    imageData: image?.data ?? "",
    otherError,
  }),
);
await client.close();
