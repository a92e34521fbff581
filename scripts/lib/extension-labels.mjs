// Prints, as JSON, the names pi's interactive header gives the extensions it loads for a
// directory: `node extension-labels.mjs <pi-coding-agent package dir> <cwd> [extension path...]`
// with PI_CODING_AGENT_DIR naming the agent directory (installed packages come from its
// settings). It runs pi's own label code (InteractiveMode.getCompactExtensionLabels) on what pi's
// own resource loader loaded; the TUI itself is not started. Works with pi 0.73 and 1.x.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [piPackage, cwd, ...extra] = process.argv.slice(2);
const pi = await import(pathToFileURL(join(piPackage, "dist", "index.js")).href);
const agentDir = process.env.PI_CODING_AGENT_DIR;
const settingsManager = pi.SettingsManager.create(cwd, agentDir);
const loader = new pi.DefaultResourceLoader({ cwd, agentDir, settingsManager, additionalExtensionPaths: extra, noSkills: true, noPromptTemplates: true, noThemes: true, noContextFiles: true });
await loader.reload();
const { extensions, errors } = loader.getExtensions();
if (errors.length > 0) throw new Error(errors.map((e) => `${e.path}: ${e.error}`).join("\n"));
const labels = Object.create(pi.InteractiveMode.prototype).getCompactExtensionLabels(extensions);
console.log(JSON.stringify(labels));
process.exit(0);
