/**
 * `/sandbox allow host[:port]`: the user's way to add a destination to `network.allowedDomains` of
 * the trusted configuration (the only writer of that list; the model cannot run a command). The
 * file is changed in place of its `network.allowedDomains` only (other keys kept, the file written
 * to a new name and renamed over the old, its mode kept), then read again, strictly, by the engine:
 * an entry the grammar refuses puts the previous file back and says why. What the re-read gives
 * applies to the next command (and python connection) of the running session and to later sessions.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import type { TrustedConfig } from "../index.d.ts";

/** What `/sandbox allow` did: the message for the user, and the configuration read again (when written). */
export interface AllowOutcome {
  message: string;
  config?: TrustedConfig;
}

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** Writes `text` to `path` through a new file renamed over it, with `mode`. */
function replaceFile(path: string, text: string, mode: number): void {
  const temp = `${path}.${process.pid}.tmp`;
  rmSync(temp, { force: true });
  writeFileSync(temp, text, { flag: "wx", mode });
  chmodSync(temp, mode);
  renameSync(temp, path);
}

/**
 * Adds `entry` (`host`, `host:port`, `*.domain`, an address) to `network.allowedDomains` of the
 * trusted file at `path`, then `reload`s the configuration; refuses a file that does not parse. An
 * error of the re-read that was not among `before` (the errors the file had) undoes the write.
 */
export function allowDestination(
  entry: string,
  path: string,
  before: readonly string[],
  reload: () => TrustedConfig | undefined,
): AllowOutcome {
  const wanted = entry.trim();
  if (wanted === "" || /\s/.test(wanted)) {
    return { message: "Usage: /sandbox allow host[:port] (for instance /sandbox allow pypi.org:443 or /sandbox allow *.github.com)." };
  }
  const existed = existsSync(path);
  let old = "";
  let doc: Record<string, unknown> = {};
  try {
    if (existed) {
      old = readFileSync(path, "utf8");
      const parsed: unknown = JSON.parse(old);
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("it is not a JSON object");
      doc = parsed as Record<string, unknown>;
    }
  } catch (err) {
    return { message: `Nothing was allowed: the configuration ${path} cannot be read as JSON (${errorText(err)}); fix it first.` };
  }
  const network = doc.network ?? {};
  if (typeof network !== "object" || network === null || Array.isArray(network)) {
    return { message: `Nothing was allowed: "network" in ${path} is not an object; fix it first.` };
  }
  const net = network as Record<string, unknown>;
  const list = net.allowedDomains ?? [];
  if (!Array.isArray(list)) return { message: `Nothing was allowed: "network.allowedDomains" in ${path} is not an array; fix it first.` };
  if (list.includes(wanted)) return { message: `${wanted} is already in network.allowedDomains of ${path}.` };
  const updated = { ...doc, network: { ...net, allowedDomains: [...list, wanted] } };
  const mode = existed ? statSync(path).mode & 0o777 : 0o600;
  try {
    mkdirSync(dirname(path), { recursive: true });
    replaceFile(path, `${JSON.stringify(updated, null, 2)}\n`, mode);
  } catch (err) {
    return { message: `Nothing was allowed: ${path} could not be written (${errorText(err)}).` };
  }
  // Read again, strictly: an entry the grammar refuses (or any new error) puts the old file back.
  const config = reload();
  const refused = config?.errors.find((e) => !before.includes(e));
  if (!config || refused) {
    try {
      if (existed) replaceFile(path, old, mode);
      else rmSync(path, { force: true });
    } catch (err) {
      return { message: `${wanted} was refused (${refused ?? "the configuration could not be read again"}), and ${path} could not be put back: ${errorText(err)}.` };
    }
    return { message: `Nothing was allowed: ${refused ?? "the configuration could not be read again"}. ${path} is as it was.` };
  }
  const canonical = config.network.allowedDomains;
  return {
    config,
    message:
      `Allowed ${wanted}: added to network.allowedDomains of ${path} (now ${canonical.join(", ")}). ` +
      "It applies from the next command of this session, and to later sessions; remove it from the file to take it back.",
  };
}
